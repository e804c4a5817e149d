#include "segment_copy.hpp"

#include "comm/cuda/device_sync.cuh"
#include "comm/cuda/gin_transport.cuh"
#include "exec/cuda/row_copy.cuh"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

constexpr int kThreads = kEpExchangeThreads;
constexpr int kWarps = kThreads / 32;

// The destination of CTA group g: the next ranks first and this rank last.
__device__ inline int destination_of_group(int group, int rank, int world) { return (rank + 1 + group) % world; }

__device__ inline comm::WaitSubject drain_subject(SegmentDrain drain) {
  return drain == SegmentDrain::GemmTiles ? comm::WaitSubject::DispatchRows : comm::WaitSubject::CombineRows;
}

// A plan this executor cannot run: recorded like a failed wait (`what` names the segment, or
// the wait past the segments), so that the host reports it and the peers stop waiting.
__device__ inline void record_invalid(const DeviceTransport& t, const SegmentCopyArgs& a, int peer, std::uint64_t what,
                                      std::uint64_t step) {
  record_failure(t, comm::WaitState::PlanInvalid, peer, drain_subject(a.drain), what, 0, 0, step);
}

__device__ inline bool flag_held(std::int32_t flag, int world) { return flag >= 0 && flag < ep_segment_flag_room(world); }

// Whether this executor can run segment `s` (see the header): its buffers, rows, columns, flag and waits.
__device__ inline bool runnable(const Segment& s, const SegmentCopyArgs& a, const PlanTables& plan, int me, int world) {
  const int src = static_cast<int>(s.src), dst = static_cast<int>(s.dst);
  if (src >= kBufferCount || dst >= kBufferCount) return false;
  const SegmentBuffer& from = a.buffers[src];
  const SegmentBuffer& to = a.buffers[dst];
  if (from.local == nullptr || to.region_offset == 0 || s.rows < 0 || s.flag_per_row != 0) return false;
  if (s.gather_count > 0 && (s.src != BufferId::Input || s.gather_count != s.rows)) return false;
  const std::int64_t first = s.gather_count > 0 ? static_cast<std::int64_t>(s.gather_begin) : s.src_row;
  if (first < 0 || first + s.rows > from.rows || s.dst_row < 0 || s.dst_row + s.rows > to.rows) return false;
  if (s.col_begin < 0 || s.col_begin > s.col_end || s.col_end > a.hidden || s.col_begin % 8 != 0 || s.col_end % 8 != 0) return false;
  if (s.dest_flag != kNoFlag && !flag_held(s.dest_flag, world)) return false;
  if (s.wait_begin + static_cast<std::uint64_t>(s.wait_count) > plan.waits.count) return false;
  for (std::uint32_t w = 0; w < s.wait_count; ++w) {
    if (plan.waits.data[s.wait_begin + w].from_rank != me) return false;  // met by stream order only if it is ours
  }
  return true;
}

__global__ void __launch_bounds__(kThreads) segment_copy_kernel(DeviceTransport t, SegmentCopyArgs a) {
  __shared__ int s_list[kThreads];  // the batch's segments of this CTA's destination, in plan order
  __shared__ int s_warp_count[kWarps];
  __shared__ int s_ok;
  const int N = t.world, me = t.rank, tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp_in_cta = tid / 32;
  const PlanTables& plan = *a.plan;
  const std::uint64_t epoch = *a.epoch;
  if (tid == 0) {
    // a failing step sends and waits for nothing more (its plan may be an empty one)
    s_ok = !transport_failed(t) && plan.header.overflow == 0;
    if (plan.header.overflow != 0 && blockIdx.x == 0) record_invalid(t, a, -1, plan.header.overflow, epoch);
  }
  __syncthreads();
  if (!s_ok) return;

  const int group = static_cast<int>(blockIdx.x) / a.ctas_per_peer, member = static_cast<int>(blockIdx.x) % a.ctas_per_peer;
  const int p = destination_of_group(group, me, N);
  const int warp = member * kWarps + warp_in_cta, warps = a.ctas_per_peer * kWarps;
  const int begin = a.first_segment;
  const int end = min(a.first_segment + a.segment_count, static_cast<int>(plan.segments.count));
  const std::size_t row_bytes = static_cast<std::size_t>(a.hidden) * 2;
  const bool gin_peer = t.region[p] == nullptr;
  const bool paced = !gin_peer && p != me && t.link_bytes_per_ns > 0.0;
  const std::uint64_t start = paced ? global_timer_ns() : 0;
  double sent = 0;
  std::int64_t running = 0;  // rows of the group's segments so far: row `running + i` is warp (running + i) % warps's
  int listed_before = 0;     // the group's segments so far: segment `listed_before + l` is put by member (...) % ctas_per_peer
  for (int base = begin; base < end; base += kThreads) {
    // 1. the batch's segments to p, in plan order (an ordered compaction over the CTA's warps)
    const int j = base + tid;
    bool mine = false;
    if (j < end) {
      const int d = plan.segments.data[j].dest_rank;
      mine = d == p;
      if ((d < 0 || d >= N) && blockIdx.x == 0) record_invalid(t, a, me, static_cast<std::uint64_t>(j), epoch);
    }
    const unsigned ballot = __ballot_sync(~0u, mine);
    if (lane == 0) s_warp_count[warp_in_cta] = __popc(ballot);
    __syncthreads();
    int before = 0, listed = 0;
    for (int w = 0; w < kWarps; ++w) {
      before += w < warp_in_cta ? s_warp_count[w] : 0;
      listed += s_warp_count[w];
    }
    if (mine) s_list[before + __popc(ballot & ((1u << lane) - 1u))] = j;
    __syncthreads();

    // 2. their rows
    for (int l = 0; l < listed; ++l) {
      const Segment s = plan.segments.data[s_list[l]];
      if (!runnable(s, a, plan, me, N)) {  // the same verdict on every thread: nothing of it moves
        if (member == 0 && tid == 0) record_invalid(t, a, p, static_cast<std::uint64_t>(s_list[l]), epoch);
        continue;
      }
      const std::byte* src = a.buffers[static_cast<int>(s.src)].local;
      const std::size_t dst_offset = a.buffers[static_cast<int>(s.dst)].region_offset;
      const std::int64_t src_first = s.gather_count > 0 ? static_cast<std::int64_t>(s.gather_begin) : s.src_row;
      const std::size_t col_offset = static_cast<std::size_t>(s.col_begin) * 2;
      const int col_bytes = static_cast<int>(s.col_end - s.col_begin) * 2;
      if (a.silent || s.rows == 0) {
        // nothing to move
      } else if (gin_peer) {  // a peer on another node: puts from the window, by one thread of one member
        if (tid == 0 && (listed_before + l) % a.ctas_per_peer == member) {
          const std::size_t src_offset = static_cast<std::size_t>(src - t.region[me]);
          ::cuda::atomic_thread_fence(::cuda::memory_order_release, ::cuda::thread_scope_system);
          if (static_cast<std::size_t>(col_bytes) == row_bytes) {  // whole rows: one put
            gin_put(t, p, dst_offset + static_cast<std::size_t>(s.dst_row) * row_bytes,
                    src_offset + static_cast<std::size_t>(src_first) * row_bytes, static_cast<std::size_t>(s.rows) * row_bytes);
          } else {
            for (std::int64_t i = 0; i < s.rows; ++i) {
              gin_put(t, p, dst_offset + static_cast<std::size_t>(s.dst_row + i) * row_bytes + col_offset,
                      src_offset + static_cast<std::size_t>(src_first + i) * row_bytes + col_offset, static_cast<std::size_t>(col_bytes));
            }
          }
        }
      } else {
        std::byte* dst_rows = region_at<std::byte>(t, p, dst_offset);
        int i = warp - static_cast<int>(running % warps);
        if (i < 0) i += warps;
        for (; i < s.rows; i += warps) {
          copy_row(dst_rows + static_cast<std::size_t>(s.dst_row + i) * row_bytes + col_offset,
                   src + static_cast<std::size_t>(src_first + i) * row_bytes + col_offset, col_bytes, lane);
          if (paced) {
            sent += col_bytes;
            if (lane == 0) pace_link(t, start, sent, 1.0 / ((N - 1) * warps));
            __syncwarp();
          }
        }
      }
      running += s.rows;
    }
    __syncthreads();  // every row this CTA stored for the batch is ordered before the releases below

    // 3. the batch's flags at p: one add per run of listed segments that name the same flag (a
    //    thread per run head); a GIN peer's signals by thread 0, after its puts on one context
    if (!a.silent) {
      auto run_at = [&](int l, std::int32_t flag) {
        int n = 1;
        while (l + n < listed && plan.segments.data[s_list[l + n]].dest_flag == flag) ++n;
        return n;
      };
      if (gin_peer) {
        if (tid == 0) {
          for (int l = 0; l < listed;) {
            const std::int32_t f = plan.segments.data[s_list[l]].dest_flag;
            const int n = run_at(l, f);
            if (flag_held(f, N)) gin_signal_add(t, p, kGinSegmentFlagSignal + static_cast<unsigned>(f), static_cast<std::uint64_t>(n));
            l += n;
          }
        }
      } else if (tid < listed) {
        const std::int32_t f = plan.segments.data[s_list[tid]].dest_flag;
        const bool head = tid == 0 || plan.segments.data[s_list[tid - 1]].dest_flag != f;
        if (head && flag_held(f, N)) {
          add_release(region_at<std::uint64_t>(t, p, a.layout.segment_flags) + f, static_cast<std::uint64_t>(run_at(tid, f)));
        }
      }
    }
    listed_before += listed;
    __syncthreads();  // all have read s_list before the next batch rewrites it
  }

  // 4. the grid ends when the flags the next phase waits for are raised here
  if (blockIdx.x != 0) return;
  std::uint32_t wait_begin = 0, wait_count = 0;
  if (a.drain == SegmentDrain::GemmTiles && plan.tiles.count > 0) {
    wait_begin = plan.tiles.data[0].wait_begin;
    wait_count = plan.tiles.data[0].wait_count;
  } else if (a.drain == SegmentDrain::CombineTasks && plan.combines.count > 0) {
    wait_begin = plan.combines.data[0].wait_begin;
    wait_count = plan.combines.data[0].wait_count;
  }
  if (wait_begin + static_cast<std::uint64_t>(wait_count) > plan.waits.count) {
    if (tid == 0) record_invalid(t, a, me, static_cast<std::uint64_t>(plan.segments.count) + wait_begin, epoch);
    return;
  }
  for (std::uint32_t i = static_cast<std::uint32_t>(tid); i < wait_count; i += kThreads) {
    const FlagWait w = plan.waits.data[wait_begin + i];
    if (!flag_held(static_cast<std::int32_t>(w.flag), N) || w.from_rank < 0 || w.from_rank >= N) {
      record_invalid(t, a, me, static_cast<std::uint64_t>(plan.segments.count) + wait_begin + i, epoch);
      continue;
    }
    wait_peer(t, region_at<std::uint64_t>(t, me, a.layout.segment_flags) + w.flag, kGinSegmentFlagSignal + w.flag,
              epoch * w.expected * static_cast<std::uint64_t>(a.ctas_per_peer), w.from_rank, drain_subject(a.drain), epoch);
  }
}

}  // namespace

void launch_segment_copy(cudaStream_t stream, const DeviceTransport& t, const SegmentCopyArgs& a) {
  if (t.world < 1 || t.world > kMaxRanks || t.rank < 0 || t.rank >= t.world) throw_internal("segment copy: bad transport ranks");
  if (a.plan == nullptr || a.epoch == nullptr || a.ctas_per_peer < 1 || a.hidden % 8 != 0 || a.first_segment < 0 ||
      a.segment_count < 0) {
    throw_internal("segment copy: bad arguments");
  }
  if (t.gin_comm != nullptr) {  // puts read the window: whatever a segment reads must live in the region
    for (const SegmentBuffer& b : a.buffers) {
      if (b.local != nullptr && (b.local < t.region[t.rank] || b.local >= t.region[t.rank] + a.layout.bytes)) {
        throw_internal("segment copy: with GIN peers the rows sent must be the region's (puts read the window)");
      }
    }
  }
  segment_copy_kernel<<<t.world * a.ctas_per_peer, kThreads, 0, stream>>>(t, a);
  TILEMOE_CUDA_CHECK_LAUNCH("segment copy");
}

int segment_copy_ctas_per_sm() {
  int ctas = 0;
  TILEMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, segment_copy_kernel, kThreads, 0));
  return ctas;
}

}  // namespace tilemoe::cuda
