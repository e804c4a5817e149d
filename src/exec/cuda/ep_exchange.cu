#include "ep_exchange.hpp"

#include <algorithm>

#include "comm/cuda/device_sync.cuh"
#include "comm/cuda/gin_transport.cuh"
#include "tilemoe/cuda/cuda_check.hpp"
#include "exec/cuda/row_copy.cuh"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

constexpr int kMaxExchangeExperts = 1024;
constexpr int kWarps = kEpExchangeThreads / 32;

std::size_t align_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

// The destination of CTA group g: the next ranks first and this rank last, so that at any
// moment the groups write to different peers (all links busy) and the local copy overlaps.
__device__ inline int destination_of_group(int group, int rank, int world) { return (rank + 1 + group) % world; }

__global__ void begin_step_kernel(std::uint64_t* epoch) { *epoch += 1; }

// A failing step leaves tables of zero rows, so that the kernels after the dispatch in stream
// order (GEMMs, combine send, consumer) touch no memory outside their buffers. One CTA.
__device__ inline void zero_receive_tables(const EpLocalTables& tables, int L, int N) {
  for (int i = static_cast<int>(threadIdx.x); i <= L; i += blockDim.x) tables.local_row_offset[i] = 0;
  for (int i = static_cast<int>(threadIdx.x); i <= L * N; i += blockDim.x) tables.block_offset[i] = 0;
  for (int i = static_cast<int>(threadIdx.x); i < L * N; i += blockDim.x) tables.return_offset[i] = 0;
}

// Dynamic shared memory: counts [world][experts], then row_offset [experts + 1], the dest
// base [experts] and a scratch [experts].
__global__ void __launch_bounds__(kEpExchangeThreads) dispatch_kernel(DeviceTransport t, EpExchangeArgs a) {
  extern __shared__ int shared[];
  const int N = t.world, E = a.experts, L = a.local_experts, me = t.rank, tid = threadIdx.x;
  int* s_counts = shared;
  int* s_row_offset = s_counts + N * E;
  int* s_dest_base = s_row_offset + E + 1;
  int* s_scratch = s_dest_base + E;
  __shared__ int s_ok;
  const std::uint64_t epoch = *a.tables.epoch;
  for (int i = tid; i <= E; i += blockDim.x) s_row_offset[i] = a.row_offset[i];
  if (tid == 0) s_ok = 1;
  __syncthreads();

  // 1. my counts into every peer's inbox, then the flag that publishes them
  if (blockIdx.x == 0 && !a.silent) {
    for (int i = tid; i < N * E; i += blockDim.x) {
      const int p = i / E, x = i % E;
      if (t.region[p] != nullptr) region_at<int>(t, p, a.layout.counts_inbox)[me * E + x] = s_row_offset[x + 1] - s_row_offset[x];
    }
    if (t.gin_comm != nullptr) {  // GIN peers get them by a put from the outbox
      for (int x = tid; x < E; x += blockDim.x) region_at<int>(t, me, a.layout.counts_outbox)[x] = s_row_offset[x + 1] - s_row_offset[x];
    }
    __syncthreads();
    if (tid < N) {
      if (t.region[tid] != nullptr) {
        store_release(region_at<std::uint64_t>(t, tid, a.layout.counts_flag) + me, epoch);
      } else {
        ::cuda::atomic_thread_fence(::cuda::memory_order_release, ::cuda::thread_scope_system);
        gin_put(t, tid, a.layout.counts_inbox + static_cast<std::size_t>(me * E) * 4, a.layout.counts_outbox,
                static_cast<std::size_t>(E) * 4);
        gin_signal_add(t, tid, kGinCountsSignal + me, 1);  // the signal's value is then the epoch
      }
    }
  }
  // 2. everybody's counts (which also says every peer is done with step epoch - 1)
  if (tid < N && !wait_peer(t, region_at<std::uint64_t>(t, me, a.layout.counts_flag) + tid, kGinCountsSignal + tid, epoch, tid,
                            comm::WaitSubject::DispatchCounts, epoch)) {
    s_ok = 0;
  }
  __syncthreads();
  if (!s_ok) {  // the step is failing
    if (blockIdx.x == 0) zero_receive_tables(a.tables, L, N);
    return;
  }
  const int* inbox = region_at<int>(t, me, a.layout.counts_inbox);
  for (int i = tid; i < N * E; i += blockDim.x) s_counts[i] = inbox[i];
  __syncthreads();

  // 3. where my rows go: the owner of expert x keeps (expert, source) blocks in that order,
  //    so my rows of x start after all rows of the owner's earlier experts and after the
  //    rows of x from lower ranks
  for (int x = tid; x < E; x += blockDim.x) {
    int total = 0, before = 0;
    for (int q = 0; q < N; ++q) {
      const int c = s_counts[q * E + x];
      total += c;
      if (q < me) before += c;
    }
    s_dest_base[x] = total;
    s_scratch[x] = before;
  }
  __syncthreads();
  if (blockIdx.x == 0) {  // my receive tables, from the column totals of my experts
    if (tid == 0) {
      int running = 0;
      for (int le = 0; le < L; ++le) {
        a.tables.local_row_offset[le] = running;
        running += s_dest_base[me * L + le];
      }
      a.tables.local_row_offset[L] = running;
      a.tables.block_offset[L * N] = running;
    }
    __syncthreads();
    for (int le = tid; le < L; le += blockDim.x) {
      int running = a.tables.local_row_offset[le];
      for (int q = 0; q < N; ++q) {
        a.tables.block_offset[le * N + q] = running;
        running += s_counts[q * E + me * L + le];
      }
    }
    for (int q = tid; q < N; q += blockDim.x) {  // rank q's permuted order: its experts ascending
      int running = 0;
      for (int x = 0; x < E; ++x) {
        if (x >= me * L && x < (me + 1) * L) a.tables.return_offset[(x - me * L) * N + q] = running;
        running += s_counts[q * E + x];
      }
    }
  }
  __syncthreads();
  __shared__ int s_over;
  if (tid == 0) s_over = 0;
  __syncthreads();
  for (int p = tid; p < N; p += blockDim.x) {
    int running = 0;
    for (int x = p * L; x < (p + 1) * L; ++x) {
      const int total = s_dest_base[x];
      s_dest_base[x] = running + s_scratch[x];
      running += total;
    }
    // every rank sees the same counts, so every rank reaches the same verdict: nobody sends
    if (running > a.layout.receive_capacity) {
      s_over = 1;
      if (blockIdx.x == 0) {
        record_failure(t, comm::WaitState::CapacityExceeded, p, comm::WaitSubject::DispatchRows,
                       static_cast<std::uint64_t>(a.layout.receive_capacity), static_cast<std::uint64_t>(running), 0, epoch);
      }
    }
  }
  __syncthreads();
  if (s_over) {
    if (blockIdx.x == 0) zero_receive_tables(a.tables, L, N);
    return;
  }

  // 4. my rows for this CTA's destination, straight to their final rows there
  const int group = blockIdx.x / a.ctas_per_peer, member = blockIdx.x % a.ctas_per_peer;
  const int p = destination_of_group(group, me, N);
  const int row_bytes = a.hidden * 2;
  if (!a.silent && t.region[p] == nullptr) {
    // a GIN peer: one put per expert block (contiguous on both sides), the group's CTAs
    // taking every ctas_per_peer-th expert; the signal follows this CTA's puts
    __syncthreads();
    if (tid == 0) {
      ::cuda::atomic_thread_fence(::cuda::memory_order_release, ::cuda::thread_scope_system);
      for (int x = p * L + member; x < (p + 1) * L; x += a.ctas_per_peer) {
        const int rows = s_row_offset[x + 1] - s_row_offset[x];
        gin_put(t, p, a.layout.dispatch_rows + static_cast<std::size_t>(s_dest_base[x]) * row_bytes,
                a.layout.send_rows + static_cast<std::size_t>(s_row_offset[x]) * row_bytes, static_cast<std::size_t>(rows) * row_bytes);
      }
      gin_signal_add(t, p, kGinDispatchSignal + me, 1);
    }
  } else if (!a.silent) {
    const int lane = tid % 32, warp = member * kWarps + tid / 32, warps = a.ctas_per_peer * kWarps;
    const int first = s_row_offset[p * L], last = s_row_offset[(p + 1) * L];
    std::byte* dst_rows = region_at<std::byte>(t, p, a.layout.dispatch_rows);
    const bool paced = p != me && t.link_bytes_per_ns > 0.0;
    const std::uint64_t start = paced ? global_timer_ns() : 0;
    double sent = 0;
    for (int i = first + warp; i < last; i += warps) {
      const int x = segment_of(s_row_offset, p * L, (p + 1) * L, i);
      const int dest = s_dest_base[x] + (i - s_row_offset[x]);
      copy_row(dst_rows + static_cast<std::size_t>(dest) * row_bytes, a.send_rows + static_cast<std::size_t>(i) * row_bytes,
               row_bytes, lane);
      if (paced) {
        sent += row_bytes;
        if (lane == 0) pace_link(t, start, sent, 1.0 / ((N - 1) * warps));
        __syncwarp();
      }
    }
    __syncthreads();  // every row of this CTA is stored before the release below
    if (tid == 0) add_release(region_at<std::uint64_t>(t, p, a.layout.dispatch_arrivals) + me, 1);
  }

  // 5. the kernel ends when every source's rows are here: the expert GEMM follows in stream order
  if (blockIdx.x == 0) {
    if (tid < N && !wait_peer(t, region_at<std::uint64_t>(t, me, a.layout.dispatch_arrivals) + tid, kGinDispatchSignal + tid,
                              epoch * a.ctas_per_peer, tid, comm::WaitSubject::DispatchRows, epoch)) {
      s_ok = 0;
    }
  }
}

__global__ void __launch_bounds__(kEpExchangeThreads) combine_send_kernel(DeviceTransport t, EpExchangeArgs a) {
  __shared__ int s_prefix[kMaxExchangeExperts + 1];
  const int N = t.world, L = a.local_experts, me = t.rank, tid = threadIdx.x;
  const std::uint64_t epoch = *a.tables.epoch;
  const int group = blockIdx.x / a.ctas_per_peer, member = blockIdx.x % a.ctas_per_peer;
  const int q = destination_of_group(group, me, N);
  const int* block = a.tables.block_offset;  // written by this step's dispatch, in stream order before us
  if (tid == 0) {
    int running = 0;
    for (int le = 0; le < L; ++le) {
      s_prefix[le] = running;
      running += block[le * N + q + 1] - block[le * N + q];
    }
    s_prefix[L] = running;
  }
  __syncthreads();
  const int row_bytes = a.hidden * 2;
  // a failing step sends nothing more (its tables may be the zero ones of a failed dispatch)
  __shared__ int s_sending;  // one verdict for the whole CTA: the branches below hold barriers
  if (tid == 0) s_sending = !a.silent && !transport_failed(t);
  __syncthreads();
  const bool sending = s_sending != 0;
  if (sending && t.region[q] == nullptr) {  // a GIN peer: one put per (expert, source) block
    if (tid == 0) {
      ::cuda::atomic_thread_fence(::cuda::memory_order_release, ::cuda::thread_scope_system);
      for (int le = member; le < L; le += a.ctas_per_peer) {
        const int rows = block[le * N + q + 1] - block[le * N + q];
        gin_put(t, q, a.layout.returned_rows + static_cast<std::size_t>(a.tables.return_offset[le * N + q]) * row_bytes,
                a.layout.expert_out + static_cast<std::size_t>(block[le * N + q]) * row_bytes, static_cast<std::size_t>(rows) * row_bytes);
      }
      gin_signal_add(t, q, kGinCombineSignal + me, 1);
    }
  } else if (sending) {
    const int lane = tid % 32, warp = member * kWarps + tid / 32, warps = a.ctas_per_peer * kWarps;
    std::byte* dst_rows = region_at<std::byte>(t, q, a.layout.returned_rows);
    const bool paced = q != me && t.link_bytes_per_ns > 0.0;
    const std::uint64_t start = paced ? global_timer_ns() : 0;
    double sent = 0;
    for (int j = warp; j < s_prefix[L]; j += warps) {
      const int le = segment_of(s_prefix, 0, L, j);
      const int within = j - s_prefix[le];
      const int src = block[le * N + q] + within;
      const int dest = a.tables.return_offset[le * N + q] + within;
      copy_row(dst_rows + static_cast<std::size_t>(dest) * row_bytes, a.expert_out + static_cast<std::size_t>(src) * row_bytes,
               row_bytes, lane);
      if (paced) {
        sent += row_bytes;
        if (lane == 0) pace_link(t, start, sent, 1.0 / ((N - 1) * warps));
        __syncwarp();
      }
    }
    __syncthreads();
    if (tid == 0) add_release(region_at<std::uint64_t>(t, q, a.layout.combine_arrivals) + me, 1);
  }
  if (blockIdx.x == 0 && tid < N) {
    wait_peer(t, region_at<std::uint64_t>(t, me, a.layout.combine_arrivals) + tid, kGinCombineSignal + tid, epoch * a.ctas_per_peer,
              tid, comm::WaitSubject::CombineRows, epoch);
  }
}

__global__ void __launch_bounds__(256) copy_row_blocks_kernel(const std::byte* src, std::byte* dst, int row_bytes,
                                                              const int* tables, int blocks) {
  const int b = blockIdx.x, lane = threadIdx.x % 32;
  const int src_start = tables[b], dst_start = tables[blocks + b], rows = tables[2 * blocks + b];
  const int warps = blockDim.x / 32;
  for (int i = blockIdx.y * warps + threadIdx.x / 32; i < rows; i += gridDim.y * warps) {
    copy_row(dst + static_cast<std::size_t>(dst_start + i) * row_bytes, src + static_cast<std::size_t>(src_start + i) * row_bytes,
             row_bytes, lane);
  }
}

std::size_t dispatch_shared_bytes(int world, int experts) {
  return static_cast<std::size_t>(world * experts + 3 * experts + 1) * sizeof(int);
}

void check_args(const DeviceTransport& t, const EpExchangeArgs& a) {
  if (t.world < 1 || t.world > kMaxRanks || t.rank < 0 || t.rank >= t.world) throw_internal("exchange: bad transport ranks");
  if (a.experts < 1 || a.experts > kMaxExchangeExperts || a.local_experts * t.world != a.experts) {
    throw_internal("exchange: bad expert counts");
  }
  if (a.hidden % 8 != 0 || a.ctas_per_peer < 1) throw_internal("exchange: bad hidden or CTA count");
  if (t.gin_comm != nullptr &&
      (a.layout.send_rows == 0 || a.send_rows != t.region[t.rank] + a.layout.send_rows || a.expert_out != t.region[t.rank] + a.layout.expert_out)) {
    throw_internal("exchange: with GIN peers the rows sent must be the region's (puts read the window)");
  }
}

}  // namespace

EpRegionLayout ep_region_layout(int world, std::int64_t experts, std::int64_t hidden, std::int64_t max_tokens,
                                std::int64_t top_k, bool remote_sources, std::int64_t receive_rows) {
  if (world < 1 || world > kMaxRanks) {
    throw_bad_input("a load/store world has 1 to " + std::to_string(kMaxRanks) + " ranks, not " + std::to_string(world));
  }
  if (experts % world != 0) throw_bad_input("the experts do not divide evenly over the ranks");
  EpRegionLayout l;
  std::size_t at = kTransportHeaderBytes;
  l.counts_inbox = at;
  at = align_up(at + static_cast<std::size_t>(world * experts) * 4, 128);
  l.counts_flag = at;
  at = align_up(at + static_cast<std::size_t>(world) * 8, 128);
  l.dispatch_arrivals = at;
  at = align_up(at + static_cast<std::size_t>(world) * 8, 128);
  l.combine_arrivals = at;
  at = align_up(at + static_cast<std::size_t>(world) * 8, 128);
  l.row_arrivals = at;  // before dispatch_rows: a new layer zeroes it with the flags
  at = align_up(at + static_cast<std::size_t>(max_tokens * top_k) * 8, 4096);
  l.receive_capacity = world * max_tokens * std::min<std::int64_t>(top_k, experts / world);
  if (receive_rows < 0) throw_bad_input("a receive capacity must not be negative (0 = the dropless worst case)");
  if (receive_rows > 0) l.receive_capacity = std::min(l.receive_capacity, receive_rows);
  l.dispatch_rows = at;
  at = align_up(at + static_cast<std::size_t>(l.receive_capacity * hidden) * 2, 4096);
  l.returned_rows = at;
  at = align_up(at + static_cast<std::size_t>(max_tokens * top_k * hidden) * 2, 4096);
  if (remote_sources) {
    l.counts_outbox = at;
    at = align_up(at + static_cast<std::size_t>(experts) * 4, 4096);
    l.send_rows = at;
    at = align_up(at + static_cast<std::size_t>(max_tokens * top_k * hidden) * 2, 4096);
    l.expert_out = at;
    at = align_up(at + static_cast<std::size_t>(l.receive_capacity * hidden) * 2, 4096);
  }
  l.bytes = at;
  return l;
}

__global__ void reset_gin_signals_kernel(DeviceTransport t) {
  const ncclDevComm& dc = gin_comm(t);
  ncclGin gin(dc, 0);
  for (unsigned id = threadIdx.x; id < kGinSignalCount; id += blockDim.x) gin.resetSignal(static_cast<ncclGinSignal_t>(id));
}

void launch_reset_gin_signals(cudaStream_t stream, const DeviceTransport& t) {
  if (t.gin_comm == nullptr) return;
  reset_gin_signals_kernel<<<1, 64, 0, stream>>>(t);
  TILEMOE_CUDA_CHECK_LAUNCH("reset GIN signals");
}

void launch_ep_begin_step(cudaStream_t stream, std::uint64_t* epoch) {
  begin_step_kernel<<<1, 1, 0, stream>>>(epoch);
  TILEMOE_CUDA_CHECK_LAUNCH("ep begin step");
}

void launch_ep_dispatch(cudaStream_t stream, const DeviceTransport& t, const EpExchangeArgs& a) {
  check_args(t, a);
  const std::size_t smem = dispatch_shared_bytes(t.world, a.experts);
  if (smem > 48 * 1024) {
    TILEMOE_CUDA_CHECK(cudaFuncSetAttribute(dispatch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  dispatch_kernel<<<t.world * a.ctas_per_peer, kEpExchangeThreads, smem, stream>>>(t, a);
  TILEMOE_CUDA_CHECK_LAUNCH("ep dispatch");
}

void launch_ep_combine_send(cudaStream_t stream, const DeviceTransport& t, const EpExchangeArgs& a) {
  check_args(t, a);
  combine_send_kernel<<<t.world * a.ctas_per_peer, kEpExchangeThreads, 0, stream>>>(t, a);
  TILEMOE_CUDA_CHECK_LAUNCH("ep combine send");
}

void launch_copy_row_blocks(cudaStream_t stream, const std::byte* src, std::byte* dst, int row_bytes, const int* tables,
                            int blocks) {
  if (blocks <= 0) return;
  if (row_bytes % 16 != 0) throw_internal("row block copy: rows must be a multiple of 16 bytes");
  // enough CTAs to fill the GPU when there are few blocks; a block's rows are split over them
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(std::max(1, std::min(32, 2048 / blocks))));
  copy_row_blocks_kernel<<<grid, 256, 0, stream>>>(src, dst, row_bytes, tables, blocks);
  TILEMOE_CUDA_CHECK_LAUNCH("ep row block copy");
}

int ep_exchange_ctas_per_sm(int world, int experts) {
  int dispatch = 0, combine = 0;
  const std::size_t smem = dispatch_shared_bytes(world, experts);
  if (smem > 48 * 1024) {
    TILEMOE_CUDA_CHECK(cudaFuncSetAttribute(dispatch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  TILEMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&dispatch, dispatch_kernel, kEpExchangeThreads, smem));
  TILEMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&combine, combine_send_kernel, kEpExchangeThreads, 0));
  return std::min(dispatch, combine);
}

}  // namespace tilemoe::cuda
