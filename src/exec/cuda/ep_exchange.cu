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

std::size_t align_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

__global__ void begin_step_kernel(std::uint64_t* epoch) { *epoch += 1; }

// A failing step leaves a receive table of zero rows, so that the kernels after it in stream
// order (GEMMs, consumer) touch no memory outside their buffers.
__device__ inline void zero_receive_table(const EpLocalTables& tables, int L) {
  for (int i = static_cast<int>(threadIdx.x); i <= L; i += blockDim.x) tables.local_row_offset[i] = 0;
}

// One CTA. Dynamic shared memory: counts [world][experts], then row_offset [experts + 1].
__global__ void __launch_bounds__(kEpExchangeThreads) exchange_counts_kernel(DeviceTransport t, EpExchangeArgs a) {
  extern __shared__ int shared[];
  const int N = t.world, E = a.experts, L = a.local_experts, me = t.rank, tid = static_cast<int>(threadIdx.x);
  int* s_counts = shared;
  int* s_row_offset = s_counts + N * E;
  __shared__ int s_ok, s_over;
  const std::uint64_t epoch = *a.tables.epoch;
  for (int i = tid; i <= E; i += blockDim.x) s_row_offset[i] = a.row_offset[i];
  if (tid == 0) {
    s_ok = 1;
    s_over = 0;
  }
  __syncthreads();

  // 1. my counts (and the tokens I send each rank once) into every peer's inbox, then the flag
  //    that publishes them
  if (!a.silent) {
    for (int i = tid; i < N * E; i += blockDim.x) {
      const int p = i / E, x = i % E;
      if (t.region[p] != nullptr) region_at<int>(t, p, a.layout.counts_inbox)[me * E + x] = s_row_offset[x + 1] - s_row_offset[x];
    }
    if (a.rank_tokens != nullptr) {  // load/store peers only (ep_region_layout)
      for (int i = tid; i < N * N; i += blockDim.x) {
        const int p = i / N, d = i % N;
        region_at<int>(t, p, a.layout.rank_tokens_inbox)[me * N + d] = a.rank_tokens[d];
      }
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
    zero_receive_table(a.tables, L);
    return;
  }
  const int* inbox = region_at<int>(t, me, a.layout.counts_inbox);
  for (int i = tid; i < N * E; i += blockDim.x) s_counts[i] = inbox[i];
  __syncthreads();

  // 3. my receive table (my local experts' rows from every source, expert-major) and every
  //    rank's receive room: every rank sees the same counts, so every rank reaches the same
  //    verdict, and nobody sends
  if (tid == 0) {
    int running = 0;
    for (int le = 0; le < L; ++le) {
      a.tables.local_row_offset[le] = running;
      for (int q = 0; q < N; ++q) running += s_counts[q * E + me * L + le];
    }
    a.tables.local_row_offset[L] = running;
  }
  for (int p = tid; p < N; p += blockDim.x) {
    long long rows = 0;
    for (int q = 0; q < N; ++q) {
      for (int x = p * L; x < (p + 1) * L; ++x) rows += s_counts[q * E + x];
    }
    if (rows > a.layout.receive_capacity) {
      s_over = 1;
      record_failure(t, comm::WaitState::CapacityExceeded, p, comm::WaitSubject::DispatchRows,
                     static_cast<std::uint64_t>(a.layout.receive_capacity), static_cast<std::uint64_t>(rows), 0, epoch);
    }
  }
  __syncthreads();
  if (s_over) zero_receive_table(a.tables, L);
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

std::size_t counts_shared_bytes(int world, int experts) {
  return static_cast<std::size_t>(world * experts + experts + 1) * sizeof(int);
}

void check_args(const DeviceTransport& t, const EpExchangeArgs& a) {
  if (t.world < 1 || t.world > kMaxRanks || t.rank < 0 || t.rank >= t.world) throw_internal("exchange: bad transport ranks");
  if (a.experts < 1 || a.experts > kMaxExchangeExperts || a.local_experts * t.world != a.experts) {
    throw_internal("exchange: bad expert counts");
  }
  if (a.hidden % 8 != 0) throw_internal("exchange: bad hidden");
  if ((a.rank_tokens != nullptr) != (a.layout.rank_tokens_inbox != 0)) throw_internal("exchange: rank token counts without their inbox");
}

}  // namespace

EpRegionLayout ep_region_layout(int world, std::int64_t experts, std::int64_t hidden, std::int64_t max_tokens,
                                std::int64_t top_k, bool remote_sources, std::int64_t receive_rows, DispatchVolume volume,
                                bool input_scales, int segment_flags) {
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
  const bool once = volume == DispatchVolume::OncePerRank;
  if (once) {
    l.rank_tokens_inbox = at;
    at = align_up(at + static_cast<std::size_t>(world * world) * 4, 128);
  }
  l.segment_flags = at;
  l.segment_flag_count = std::max(ep_segment_flag_room(world), segment_flags);
  if (remote_sources && l.segment_flag_count > ep_segment_flag_room(world)) {
    throw_bad_input("a strategy with more than " + std::to_string(ep_segment_flag_room(world)) + " segment flags does not reach GIN peers");
  }
  at = align_up(at + static_cast<std::size_t>(l.segment_flag_count) * 8, 128);
  l.row_arrivals = at;  // before dispatch_rows: a new layer zeroes it with the flags
  at = align_up(at + static_cast<std::size_t>(max_tokens * top_k) * 8, 4096);
  l.receive_capacity = world * max_tokens * std::min<std::int64_t>(top_k, experts / world);
  if (receive_rows < 0) throw_bad_input("a receive capacity must not be negative (0 = the dropless worst case)");
  if (receive_rows > 0) l.receive_capacity = std::min(l.receive_capacity, receive_rows);
  l.dispatch_rows = at;
  at = align_up(at + static_cast<std::size_t>(l.receive_capacity * hidden) * 2, 4096);
  l.returned_rows = at;
  at = align_up(at + static_cast<std::size_t>(max_tokens * top_k * hidden) * 2, 4096);
  if (once) {
    if (remote_sources) throw_bad_input("a dispatch once per destination rank does not reach GIN peers (other nodes) yet: use row-per-expert");
    // every token of the other sources once at most, and never more tokens than the rows they bring
    l.received_capacity = std::min(static_cast<std::int64_t>(world - 1) * max_tokens, l.receive_capacity);
    l.received_rows = at;
    at = align_up(at + static_cast<std::size_t>(l.received_capacity * hidden) * 2, 4096);
    // the permuted order, the send lists (a token to each other rank at most) and a placement per expert row
    l.gather_room = max_tokens * top_k + max_tokens * std::min<std::int64_t>(top_k, world - 1) + l.receive_capacity;
    l.gather_rows = at;
    at = align_up(at + static_cast<std::size_t>(l.gather_room) * 4, 4096);
  }
  if (input_scales) {
    if (remote_sources) throw_bad_input("the experts' input scaled by the routing weight (Llama-4's) does not reach GIN peers yet");
    l.expert_in_scale = at;
    at = align_up(at + static_cast<std::size_t>(l.receive_capacity) * 4, 4096);
  }
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

void launch_ep_exchange_counts(cudaStream_t stream, const DeviceTransport& t, const EpExchangeArgs& a) {
  check_args(t, a);
  const std::size_t smem = counts_shared_bytes(t.world, a.experts);
  if (smem > 48 * 1024) {
    TILEMOE_CUDA_CHECK(
        cudaFuncSetAttribute(exchange_counts_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  exchange_counts_kernel<<<1, kEpExchangeThreads, smem, stream>>>(t, a);
  TILEMOE_CUDA_CHECK_LAUNCH("ep exchange counts");
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

}  // namespace tilemoe::cuda
