#include "table_schedule.hpp"

#include "kernels/gemm/planned/planned_gemm.hpp"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

// The last index i in [lo, hi) with offsets[i] <= value (offsets ascending).
__device__ inline int segment_of(const int* offsets, int lo, int hi, int value) {
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (offsets[mid] <= value) lo = mid; else hi = mid;
  }
  return lo;
}

constexpr int kOrderThreads = 1024;
constexpr int kMaxGroups = 1024;

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

}  // namespace

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

}  // namespace tilemoe::cuda
