#include "tile_signal.hpp"

#include <algorithm>

#include "comm/cuda/device_sync.cuh"
#include "combine_vector.cuh"
#include "cuda_check.hpp"
#include "exchange_device.cuh"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

constexpr int kOrderThreads = 1024;
constexpr int kConsumerThreads = 512;
constexpr int kMaxGroups = 1024;
constexpr int kMaxBandsPerSegment = 32;
constexpr int kArrivalCombineThreads = 256;

// Stable partition of `n` items by `is_remote(i)` with one CTA: `place(i, position)` gets each
// item's place, remote ones first. Two passes over chunks of the CTA's width with a block scan.
template <typename IsRemote, typename Place>
__device__ void stable_partition(int n, IsRemote is_remote, Place place) {
  __shared__ int scan[kOrderThreads];
  __shared__ int carry;
  const int t = static_cast<int>(threadIdx.x);
  int remote_total = 0;
  for (int pass = 0; pass < 2; ++pass) {
    if (t == 0) carry = 0;
    __syncthreads();
    for (int base = 0; base < n; base += kOrderThreads) {
      const int i = base + t;
      const bool remote = i < n && is_remote(i);
      const bool mine = i < n && (pass == 0 ? remote : !remote);
      scan[t] = mine ? 1 : 0;
      __syncthreads();
      for (int step = 1; step < kOrderThreads; step *= 2) {
        const int add = t >= step ? scan[t - step] : 0;
        __syncthreads();
        scan[t] += add;
        __syncthreads();
      }
      if (mine) place(i, (pass == 0 ? 0 : remote_total) + carry + scan[t] - 1);
      __syncthreads();
      if (t == kOrderThreads - 1) carry += scan[t];
      __syncthreads();
    }
    if (pass == 0) remote_total = carry;
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kOrderThreads) build_bands_kernel(const int* row_offset, const int* block_offset, int groups,
                                                                   int world, int me, TileBand* bands, int capacity, int* count) {
  __shared__ int band_offset[kMaxGroups + 1];
  if (threadIdx.x == 0) {
    int running = 0;
    for (int g = 0; g < groups; ++g) {
      band_offset[g] = running;
      running += (row_offset[g + 1] - row_offset[g] + kPlannedTileM - 1) / kPlannedTileM;
    }
    band_offset[groups] = running;
  }
  __syncthreads();
  const int total = band_offset[groups];
  if (total > capacity) {
    if (threadIdx.x == 0) *count = -1;
    return;
  }
  auto band_at = [&](int b) {
    const int g = segment_of(band_offset, 0, groups, b);
    TileBand band;
    const int m = b - band_offset[g];
    band.row_begin = row_offset[g] + m * kPlannedTileM;
    band.rows = min(kPlannedTileM, row_offset[g + 1] - band.row_begin);
    band.id = b;
    band.group = g;
    band.remote = holds_remote_rows(block_offset, g, world, me, band.row_begin, band.row_begin + band.rows);
    return band;
  };
  stable_partition(
      total, [&](int b) { return band_at(b).remote != 0; }, [&](int b, int position) { bands[position] = band_at(b); });
  if (threadIdx.x == 0) *count = total;
}

__global__ void __launch_bounds__(kOrderThreads) order_remote_first_kernel(GemmTileEntry* table, const int* count, int cluster_size,
                                                                          const int* block_offset, int world, int me,
                                                                          GemmTileEntry* scratch) {
  const int entries = *count;
  if (entries <= 0) return;
  for (int i = static_cast<int>(threadIdx.x); i < entries; i += kOrderThreads) scratch[i] = table[i];
  __syncthreads();
  auto item_remote = [&](int item) {
    for (int j = 0; j < cluster_size; ++j) {
      const GemmTileEntry& e = scratch[item * cluster_size + j];
      if (e.rows > 0 && holds_remote_rows(block_offset, e.group, world, me, e.row_begin, e.row_begin + e.rows)) return true;
    }
    return false;
  };
  stable_partition(entries / cluster_size, item_remote, [&](int item, int position) {
    for (int j = 0; j < cluster_size; ++j) table[position * cluster_size + j] = scratch[item * cluster_size + j];
  });
}

// One thread: this rank's GEMM flag >= expected (GPU scope: the producer is on this GPU),
// bounded like every other wait.
__device__ inline bool wait_tile_flag(const DeviceTransport& t, const unsigned* flag, unsigned expected, std::uint64_t step) {
  ::cuda::atomic_ref<unsigned, ::cuda::thread_scope_device> ref(*const_cast<unsigned*>(flag));
  return bounded_wait(t, [&ref] { return static_cast<std::uint64_t>(ref.load(::cuda::memory_order_acquire)); }, expected, t.rank,
                      comm::WaitSubject::TileFlags, step);
}

__global__ void __launch_bounds__(kConsumerThreads) consumer_kernel(DeviceTransport t, TileSignalArgs a) {
  const EpExchangeArgs& x = a.exchange;
  const int N = t.world, me = t.rank, tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32, warps = kConsumerThreads / 32;
  const std::uint64_t epoch = *x.tables.epoch;
  const int* block = x.tables.block_offset;
  const int* back = x.tables.return_offset;
  const int row_bytes = x.hidden * 2;
  __shared__ int s_ok;
  __shared__ TileBand s_bands[kMaxBandsPerSegment];
  if (tid == 0) s_ok = !x.silent && !transport_failed(t);
  __syncthreads();
  const int bands = max(*a.band_count, 0);
  const int per = a.bands_per_segment;
  const int segments = (bands + per - 1) / per;
  for (int s = static_cast<int>(blockIdx.x); s < segments; s += static_cast<int>(gridDim.x)) {
    const int first = s * per, here = min(per, bands - first);
    if (a.segment_times != nullptr && tid == 0) a.segment_times[3 * s] = global_timer_ns();
    if (tid < here) {
      s_bands[tid] = a.bands[first + tid];
      if (!wait_tile_flag(t, a.flags + s_bands[tid].id, a.tiles_per_band, epoch)) s_ok = 0;
    }
    __syncthreads();  // extends the flags' acquire to the CTA
    const bool ok = s_ok != 0;
    __syncthreads();  // all have read s_ok before the next segment's waits may clear it
    if (!ok) break;
    if (a.segment_times != nullptr && tid == 0) a.segment_times[3 * s + 1] = global_timer_ns();
    // the segment's rows, a warp per row, each to its source at its place in the source's order;
    // with link emulation every warp paces its remote rows to its share of the rank's link
    // (all consumer warps together, from the segment's start: conservative when few are busy)
    // after its rows, the warp raises their arrival flags at their sources, up to 32 at once
    // (a lane per row, each a release after the warp's barrier: one fence for 32 rows)
    const bool paced = t.link_bytes_per_ns > 0.0;
    const std::uint64_t copy_start = paced ? global_timer_ns() : 0;
    double sent = 0;
    int pending = 0, flag_rank = 0, flag_row = 0;  // pending is the same on all lanes
    auto raise_pending = [&] {
      __syncwarp();  // the warp's row stores are ordered before each lane's release
      if (lane < pending) store_release(region_at<std::uint64_t>(t, flag_rank, x.layout.row_arrivals) + flag_row, epoch);
      pending = 0;
    };
    for (int b = 0; b < here; ++b) {
      const TileBand band = s_bands[b];
      for (int r = warp; r < band.rows; r += warps) {
        const int row = band.row_begin + r;
        const int q = segment_of(block + band.group * N, 0, N, row);
        const int dest = back[band.group * N + q] + (row - block[band.group * N + q]);
        copy_row(region_at<std::byte>(t, q, x.layout.returned_rows) + static_cast<std::size_t>(dest) * row_bytes,
                 x.expert_out + static_cast<std::size_t>(row) * row_bytes, row_bytes, lane);
        if (lane == pending) {
          flag_rank = q;
          flag_row = dest;
        }
        if (++pending == 32) raise_pending();
        if (paced && q != me) {
          sent += row_bytes;
          if (lane == 0) pace_link(t, copy_start, sent, 1.0 / (static_cast<double>(gridDim.x) * warps));
          __syncwarp();
        }
      }
    }
    if (pending > 0) raise_pending();
    __syncthreads();
    if (a.segment_times != nullptr && tid == 0) a.segment_times[3 * s + 2] = global_timer_ns();
  }
}

// The owner's combine: token after token (a persistent grid, tokens strided over its CTAs),
// each as soon as its k returned rows have landed, in top-k slot order as the sequential combine.
__global__ void __launch_bounds__(kArrivalCombineThreads) arrival_combine_kernel(DeviceTransport t, ArrivalCombineArgs a) {
  const std::uint64_t epoch = *a.epoch;
  const std::uint64_t* arrivals = region_at<std::uint64_t>(t, t.rank, a.row_arrivals);
  const auto* rows = region_at<__nv_bfloat16>(t, t.rank, a.returned_rows);
  const int tid = static_cast<int>(threadIdx.x), k = a.top_k, vectors = a.hidden / 8;
  __shared__ int s_ok;
  if (tid == 0) s_ok = !transport_failed(t);
  __syncthreads();
  for (int token = static_cast<int>(blockIdx.x); token < a.tokens; token += static_cast<int>(gridDim.x)) {
    for (int j = tid; j < k; j += kArrivalCombineThreads) {
      const int slot = token * k + j;
      const int source = a.expert[slot] / a.local_experts;  // whose consumer ships the row
      if (s_ok && !wait_at_least(t, arrivals + a.row_of_slot[slot], epoch, source, comm::WaitSubject::CombineRows, epoch)) {
        s_ok = 0;
      }
    }
    __syncthreads();  // extends the flags' acquire to the CTA
    const bool ok = s_ok != 0;
    __syncthreads();  // all have read s_ok before the next token's waits may clear it
    if (!ok) return;
    for (int v = tid; v < vectors; v += kArrivalCombineThreads) {
      reinterpret_cast<uint4*>(a.output + static_cast<std::size_t>(token) * a.hidden)[v] =
          combine_vector(rows, a.weight, a.row_of_slot, token, k, a.hidden, v);
    }
  }
}

}  // namespace

int arrival_combine_ctas_per_sm() {
  int blocks = 0;
  TILEMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, arrival_combine_kernel, kArrivalCombineThreads, 0));
  return blocks;
}

void launch_arrival_combine(cudaStream_t stream, const DeviceTransport& t, const ArrivalCombineArgs& a) {
  if (a.tokens == 0) return;
  if (a.ctas < 1 || a.local_experts < 1 || a.top_k < 1 || a.hidden % 8 != 0) throw_internal("tile signal: bad combine arguments");
  // no more CTAs than tokens (a decode step has fewer tokens than the grid has room for)
  arrival_combine_kernel<<<std::min(a.ctas, a.tokens), kArrivalCombineThreads, 0, stream>>>(t, a);
  TILEMOE_CUDA_CHECK_LAUNCH("tile signal combine");
}

std::int64_t max_bands(std::int64_t rows, int groups) { return rows / kPlannedTileM + groups + 1; }

void launch_build_bands(cudaStream_t stream, const int* row_offset, const int* block_offset, int groups, int world, int me,
                        TileBand* bands, int capacity, int* count) {
  if (groups < 1 || groups > kMaxGroups) throw_internal("tile signal: bad group count");
  build_bands_kernel<<<1, kOrderThreads, 0, stream>>>(row_offset, block_offset, groups, world, me, bands, capacity, count);
  TILEMOE_CUDA_CHECK_LAUNCH("tile signal bands");
}

void launch_order_remote_first(cudaStream_t stream, GemmTileEntry* table, const int* count, int cluster_size,
                               const int* block_offset, int groups, int world, int me, GemmTileEntry* scratch) {
  if (cluster_size < 1 || groups < 1) throw_internal("tile signal: bad table order arguments");
  order_remote_first_kernel<<<1, kOrderThreads, 0, stream>>>(table, count, cluster_size, block_offset, world, me, scratch);
  TILEMOE_CUDA_CHECK_LAUNCH("tile signal table order");
}

void launch_tile_signal_consumer(cudaStream_t stream, const DeviceTransport& t, const TileSignalArgs& a) {
  if (a.ctas < 1 || a.bands_per_segment < 1 || a.bands_per_segment > kMaxBandsPerSegment || a.tiles_per_band < 1) {
    throw_internal("tile signal: bad consumer arguments");
  }
  if (a.ctas % 2 != 0) throw_internal("tile signal: the consumer launches clusters of 2 CTAs");
  // Clusters of 2, like GEMM1's: a lone consumer CTA on each of several SM pairs would leave
  // single free SMs where no GEMM cluster fits, and the GEMM clusters that do not fit would
  // run as a second wave (measured: GEMM1 twice as long at 4 and 8 loose consumer CTAs)
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(a.ctas));
  config.blockDim = dim3(kConsumerThreads);
  config.stream = stream;
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 2;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  TILEMOE_CUDA_CHECK(cudaLaunchKernelEx(&config, consumer_kernel, t, a));
  TILEMOE_CUDA_CHECK_LAUNCH("tile signal consumer");
}

}  // namespace tilemoe::cuda
