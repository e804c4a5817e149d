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

// The destination of CTA group g: the next ranks first and this rank last; and back.
__device__ inline int destination_of_group(int group, int rank, int world) { return (rank + 1 + group) % world; }
__device__ inline int group_of_destination(int dest, int rank, int world) { return (dest - rank - 1 + 2 * world) % world; }

__device__ inline comm::WaitSubject drain_subject(SegmentDrain drain) {
  return drain == SegmentDrain::GemmTiles ? comm::WaitSubject::DispatchRows : comm::WaitSubject::CombineRows;
}

// A plan this executor cannot run: recorded like a failed wait (`what` names the segment, or
// the wait past the segments), so that the host reports it and the peers stop waiting.
__device__ inline void record_invalid(const DeviceTransport& t, const SegmentCopyArgs& a, int peer, std::uint64_t what,
                                      std::uint64_t step) {
  record_failure(t, comm::WaitState::PlanInvalid, peer, drain_subject(a.drain), what, 0, 0, step);
}

__device__ inline bool flag_held(std::int32_t flag, const EpRegionLayout& layout) { return flag >= 0 && flag < layout.segment_flag_count; }

// Whether this executor can run segment `s` (see the header): its buffers, rows, columns, flag and waits.
__device__ inline bool runnable(const Segment& s, const SegmentCopyArgs& a, const PlanTables& plan, int me, int world) {
  const int src = static_cast<int>(s.src), dst = static_cast<int>(s.dst);
  if (src >= kBufferCount || dst >= kBufferCount) return false;
  const SegmentBuffer& from = a.buffers[src];
  const SegmentBuffer& to = a.buffers[dst];
  if (from.local == nullptr || to.region_offset == 0 || s.rows < 0 || s.flag_per_row != 0) return false;
  if (s.dst_row < 0 || s.dst_row + s.rows > to.rows) return false;
  if (s.gather_count > 0) {  // each gathered row is checked as it is read (through_table)
    if (s.gather_count != s.rows) return false;
    if (a.gather_rows != nullptr) {
      if (s.gather_begin + static_cast<std::int64_t>(s.rows) > a.gather_room) return false;
    } else if (s.src != BufferId::Input || s.gather_begin + static_cast<std::int64_t>(s.rows) > from.rows) {
      return false;
    }
  } else if (s.src_row < 0 || s.src_row + s.rows > from.rows) {
    return false;
  }
  if (s.col_begin < 0 || s.col_begin > s.col_end || s.col_end > a.hidden || s.col_begin % 8 != 0 || s.col_end % 8 != 0) return false;
  if (s.dest_flag != kNoFlag && !flag_held(s.dest_flag, a.layout)) return false;
  if (s.wait_begin + static_cast<std::uint64_t>(s.wait_count) > plan.waits.count) return false;
  for (std::uint32_t w = 0; w < s.wait_count; ++w) {  // another rank's flag: one it raises here by a segment
    const FlagWait fw = plan.waits.data[s.wait_begin + w];
    if (fw.from_rank != me && (fw.from_rank < 0 || fw.from_rank >= world || !flag_held(static_cast<std::int32_t>(fw.flag), a.layout))) {
      return false;
    }
  }
  return true;
}

// The rank whose CTA group runs segment `s`: its destination, or for a segment of this rank's
// own that waits for another rank (a placement of what that rank sent), that rank, so that the
// group sending to q also places what q sent here, and the local copies spread over all groups
// instead of crowding this rank's own.
__device__ inline int group_rank_of(const Segment& s, const PlanTables& plan, int me, int world) {
  if (s.dest_rank != me) return s.dest_rank;
  for (std::uint32_t w = 0; w < s.wait_count && s.wait_begin + w < plan.waits.count; ++w) {
    const int from = plan.waits.data[s.wait_begin + w].from_rank;
    if (from != me && from >= 0 && from < world) return from;
  }
  return me;
}

// With serial sends: the plan's last send before segment `j` in [begin, j) to a rank other than
// this one and `dest` (a send to `dest` before j is this group's own), or -1.
__device__ inline int previous_send(const PlanTables& plan, int begin, int j, int me, int dest) {
  for (int i = j - 1; i >= begin; --i) {
    const int d = plan.segments.data[i].dest_rank;
    if (d != me && d != dest) return i;
  }
  return -1;
}

// The raises segment `j`'s flag gets from its group in a step: one per segment of [begin, end) to
// the same rank and flag, from every CTA of the group.
__device__ inline std::uint64_t raises_per_step(const PlanTables& plan, int begin, int end, int j, int ctas_per_peer) {
  const Segment& s = plan.segments.data[j];
  std::uint64_t n = 0;
  for (int i = begin; i < end; ++i) {
    const Segment& o = plan.segments.data[i];
    n += o.dest_rank == s.dest_rank && o.dest_flag == s.dest_flag ? 1u : 0u;
  }
  return n * static_cast<std::uint64_t>(ctas_per_peer);
}

// With serial sends the CTA groups are the plan's steps, not its destinations: group g sends the
// plan's g-th destination (in the order of its sends) and places the rows of the g-th source it
// places (in the order of its placements), which land while it sends (comet's ring: step i sends
// to r - i while r + i's rows arrive); the last group copies this rank's own rows. A placement in
// the group of its source's destination would wait behind every send before it.
__device__ inline int serial_destination(const PlanTables& plan, int begin, int end, int me, int group) {
  int seen = 0, last = -1;
  for (int i = begin; i < end; ++i) {
    const int d = plan.segments.data[i].dest_rank;
    if (d == me || d == last) continue;
    if (seen++ == group) return d;
    last = d;
  }
  return me;
}
// The group of a placement that waits for source q: q's place among the sources the plan places.
__device__ inline int serial_placement_group(const PlanTables& plan, int begin, int end, int me, int q) {
  int seen = 0, last = -1;
  for (int i = begin; i < end; ++i) {
    const Segment& s = plan.segments.data[i];
    if (s.dest_rank != me || s.wait_count == 0) continue;
    const int from = plan.waits.data[s.wait_begin].from_rank;
    if (from == me || from == last) continue;
    if (from == q) return seen;
    ++seen;
    last = from;
  }
  return -1;
}

// With packed CTAs (SegmentCopyArgs::packed_ctas): the CTA that runs segment `s`.
__device__ inline int packed_cta_of(const Segment& s, const PlanTables& plan, const SegmentCopyArgs& a, int begin, int end, int me,
                                    int world) {
  const int ctas = a.packed_ctas, owner = group_rank_of(s, plan, me, world);
  if (!a.serial_sends) return group_of_destination(owner, me, world) % ctas;
  if (ctas == 1 || s.dest_rank != me) return 0;  // the sends, one after another
  const int placed = owner == me ? 0 : 1 + serial_placement_group(plan, begin, end, me, owner);  // own rows first
  return 1 + placed % (ctas - 1);
}

// Whether flag wait `w` is for a flag of this rank that a kernel beside the copy raises.
__device__ inline bool raised_beside(const FlagWait& w, const SegmentCopyArgs& a, int me) {
  return w.from_rank == me && a.own_flags != nullptr && w.flag >= a.own_flag_begin && w.flag - a.own_flag_begin < a.own_flag_count;
}
// Whether segment `s` waits for something not met by stream order: another rank, or a kernel
// beside the copy (the same answer on every thread).
__device__ inline bool waits_for_others(const Segment& s, const PlanTables& plan, const SegmentCopyArgs& a, int me) {
  for (std::uint32_t w = 0; w < s.wait_count; ++w) {
    const FlagWait& fw = plan.waits.data[s.wait_begin + w];
    if (fw.from_rank != me || raised_beside(fw, a, me)) return true;
  }
  return false;
}

__global__ void __launch_bounds__(kThreads) segment_copy_kernel(DeviceTransport t, SegmentCopyArgs a) {
  __shared__ int s_list[kThreads];  // the batch's segments of this CTA's group, in plan order
  __shared__ int s_warp_count[kWarps];
  __shared__ int s_ok, s_stalled;
  const int N = t.world, me = t.rank, tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp_in_cta = tid / 32;
  const PlanTables& plan = *a.plan;
  const std::uint64_t epoch = *a.epoch;
  if (tid == 0) {
    // a failing step sends and waits for nothing more (its plan may be an empty one)
    s_ok = !transport_failed(t) && plan.header.overflow == 0;
    s_stalled = 0;
    if (plan.header.overflow != 0 && blockIdx.x == 0) record_invalid(t, a, -1, plan.header.overflow, epoch);
  }
  __syncthreads();
  if (!s_ok) return;

  const bool packed = a.packed_ctas > 0;
  const int group = static_cast<int>(blockIdx.x) / a.ctas_per_peer, member = static_cast<int>(blockIdx.x) % a.ctas_per_peer;
  const int begin = a.first_segment;
  const int end = min(a.first_segment + a.segment_count, static_cast<int>(plan.segments.count));
  // the group's destination (packed: none of its own, this rank's for the failures it records)
  const int p = packed ? me : a.serial_sends ? serial_destination(plan, begin, end, me, group) : destination_of_group(group, me, N);
  const int warp = member * kWarps + warp_in_cta, warps = a.ctas_per_peer * kWarps;
  const std::size_t row_bytes = static_cast<std::size_t>(a.hidden) * 2;
  const bool paced_group = t.region[p] != nullptr && (packed || p != me) && t.link_bytes_per_ns > 0.0;
  // each warp's share of the link: serial sends have it to themselves, else it is shared by the
  // groups (packed: the CTAs) sending to other ranks at once
  const int senders = a.serial_sends ? 1 : packed ? min(a.packed_ctas, N - 1) : N - 1;
  const double warp_share = 1.0 / (static_cast<double>(max(senders, 1)) * warps);
  std::uint64_t start = paced_group ? global_timer_ns() : 0;
  double sent = 0;
  std::int64_t running = 0;  // rows of the group's segments so far: row `running + i` is warp (running + i) % warps's
  int listed_before = 0;     // the group's segments so far: segment `listed_before + l` is put by member (...) % ctas_per_peer
  // the waits this CTA met last: the placements of one source share them (their flags only grow,
  // so met once they stay met for the step)
  std::uint32_t met_begin = 0, met_count = 0;
  int serial_dest = -1;  // serial sends: the destination whose send this CTA started last

  // The flags of the listed segments [from, to) at their destinations, after a __syncthreads that
  // orders every row this CTA stored for them before the releases: one add per run of segments
  // naming the same flag at the same rank (a thread per run head); a GIN peer's signals by
  // thread 0, after its puts on one context.
  auto raise_flags = [&](int from, int to) {
    if (a.silent) return;
    auto same = [&](int l, int m) {
      const Segment& x = plan.segments.data[s_list[l]];
      const Segment& y = plan.segments.data[s_list[m]];
      return x.dest_flag == y.dest_flag && x.dest_rank == y.dest_rank;
    };
    auto run_at = [&](int l) {
      int n = 1;
      while (l + n < to && same(l, l + n)) ++n;
      return n;
    };
    if (t.region[p] == nullptr) {  // a GIN peer's group: its segments all go there
      if (tid == 0) {
        for (int l = from; l < to;) {
          const std::int32_t f = plan.segments.data[s_list[l]].dest_flag;
          const int n = run_at(l);
          if (flag_held(f, a.layout)) gin_signal_add(t, p, kGinSegmentFlagSignal + static_cast<unsigned>(f), static_cast<std::uint64_t>(n));
          l += n;
        }
      }
      return;
    }
    const int l = from + tid;
    if (l >= to) return;
    const Segment& s = plan.segments.data[s_list[l]];
    if ((l == from || !same(l - 1, l)) && flag_held(s.dest_flag, a.layout)) {
      add_release(region_at<std::uint64_t>(t, s.dest_rank, a.layout.segment_flags) + s.dest_flag, static_cast<std::uint64_t>(run_at(l)));
    }
  };

  for (int base = begin; base < end; base += kThreads) {
    // 1. the batch's segments of this group, in plan order (an ordered compaction over the CTA's warps)
    const int j = base + tid;
    bool mine = false;
    if (j < end) {
      const Segment& s = plan.segments.data[j];
      const int d = s.dest_rank;
      if (d < 0 || d >= N) {
        if (blockIdx.x == 0) record_invalid(t, a, me, static_cast<std::uint64_t>(j), epoch);
      } else {
        const int owner = group_rank_of(s, plan, me, N);
        if (packed) {
          mine = packed_cta_of(s, plan, a, begin, end, me, N) == static_cast<int>(blockIdx.x);
        } else if (!a.serial_sends || s.dest_rank != me) {
          mine = owner == p;
        } else if (owner == me) {  // this rank's own rows: the last group's
          mine = group == N - 1;
        } else {
          mine = serial_placement_group(plan, begin, end, me, owner) == group;
        }
      }
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
    int raised = 0;  // the listed segments whose flags are up
    for (int l = 0; l < listed; ++l) {
      const Segment s = plan.segments.data[s_list[l]];
      if (packed && l > raised) {  // a run of segments naming one flag has ended: raise it now
        const Segment& prior = plan.segments.data[s_list[l - 1]];
        if (prior.dest_flag != s.dest_flag || prior.dest_rank != s.dest_rank) {
          __syncthreads();
          raise_flags(raised, l);
          raised = l;
        }
      }
      if (!runnable(s, a, plan, me, N)) {  // the same verdict on every thread: nothing of it moves
        if (member == 0 && tid == 0) record_invalid(t, a, p, static_cast<std::uint64_t>(s_list[l]), epoch);
        continue;
      }
      if ((s.wait_begin != met_begin || s.wait_count != met_count) && waits_for_others(s, plan, a, me)) {  // every CTA of the group
        // first the flags of what this CTA copied so far: the peer may be waiting for them
        __syncthreads();
        raise_flags(raised, l);
        raised = l;
        for (std::uint32_t w = static_cast<std::uint32_t>(tid); w < s.wait_count; w += kThreads) {
          const FlagWait fw = plan.waits.data[s.wait_begin + w];
          if (raised_beside(fw, a, me)) {
            if (!wait_tile_flag(t, a.own_flags + (fw.flag - a.own_flag_begin), fw.expected, epoch)) s_stalled = 1;
          } else if (fw.from_rank != me &&
                     !wait_peer(t, region_at<std::uint64_t>(t, me, a.layout.segment_flags) + fw.flag, kGinSegmentFlagSignal + fw.flag,
                                epoch * fw.expected * static_cast<std::uint64_t>(a.ctas_per_peer), fw.from_rank, drain_subject(a.drain),
                                epoch)) {
            s_stalled = 1;
          }
        }
        __syncthreads();  // also extends the acquire to the CTA
        if (s_stalled) return;  // recorded: the step is failing
        met_begin = s.wait_begin;
        met_count = s.wait_count;
        if (paced_group) {  // the link was idle while this CTA waited: no burst of saved-up bytes after it
          start = global_timer_ns();
          sent = 0;
        }
      }
      const int dest = s.dest_rank;
      if ((a.serial_sends || packed) && dest != me && dest != serial_dest && !a.silent) {  // after the previous send has landed, with the whole link
        serial_dest = dest;
        // (packed: this CTA made the previous send, and raised its flags as its run ended)
        const int before = packed ? -1 : previous_send(plan, begin, s_list[l], me, dest);
        if (before >= 0) {
          const Segment& prior = plan.segments.data[before];
          if (tid == 0 && flag_held(prior.dest_flag, a.layout) &&
              !wait_at_least(t, region_at<std::uint64_t>(t, prior.dest_rank, a.layout.segment_flags) + prior.dest_flag,
                             epoch * raises_per_step(plan, begin, end, before, a.ctas_per_peer), me, drain_subject(a.drain), epoch)) {
            s_stalled = 1;
          }
          __syncthreads();
          if (s_stalled) return;  // recorded: the step is failing
        }
        if (paced_group) {
          start = global_timer_ns();
          sent = 0;
        }
      }
      const bool gin_peer = t.region[dest] == nullptr;
      const bool paced = paced_group && dest != me;
      const SegmentBuffer& from = a.buffers[static_cast<int>(s.src)];
      const std::byte* src = from.local;
      const std::size_t dst_offset = a.buffers[static_cast<int>(s.dst)].region_offset;
      const bool through_table = s.gather_count > 0 && a.gather_rows != nullptr;
      const std::int64_t src_first = s.gather_count > 0 && !through_table ? static_cast<std::int64_t>(s.gather_begin) : s.src_row;
      const std::size_t col_offset = static_cast<std::size_t>(s.col_begin) * 2;
      const int col_bytes = static_cast<int>(s.col_end - s.col_begin) * 2;
      if (a.silent || s.rows == 0) {
        // nothing to move
      } else if (gin_peer) {  // a peer on another node: puts from the window, by one thread of one member
        if (tid == 0 && (listed_before + l) % a.ctas_per_peer == member) {
          const std::size_t src_offset = static_cast<std::size_t>(src - t.region[me]);
          ::cuda::atomic_thread_fence(::cuda::memory_order_release, ::cuda::thread_scope_system);
          if (static_cast<std::size_t>(col_bytes) == row_bytes) {  // whole rows: one put
            gin_put(t, dest, dst_offset + static_cast<std::size_t>(s.dst_row) * row_bytes,
                    src_offset + static_cast<std::size_t>(src_first) * row_bytes, static_cast<std::size_t>(s.rows) * row_bytes);
          } else {
            for (std::int64_t i = 0; i < s.rows; ++i) {
              gin_put(t, dest, dst_offset + static_cast<std::size_t>(s.dst_row + i) * row_bytes + col_offset,
                      src_offset + static_cast<std::size_t>(src_first + i) * row_bytes + col_offset, static_cast<std::size_t>(col_bytes));
            }
          }
        }
      } else {
        std::byte* dst_rows = region_at<std::byte>(t, dest, dst_offset);
        int i = warp - static_cast<int>(running % warps);
        if (i < 0) i += warps;
        for (; i < s.rows; i += warps) {
          std::int64_t src_row = src_first + i;
          if (through_table) {
            src_row = a.gather_rows[s.gather_begin + static_cast<std::uint32_t>(i)];
            if (src_row < 0 || src_row >= from.rows) {  // a table entry past the buffer: the row is not copied
              if (lane == 0) record_invalid(t, a, p, static_cast<std::uint64_t>(s_list[l]), epoch);
              continue;
            }
          }
          copy_row(dst_rows + static_cast<std::size_t>(s.dst_row + i) * row_bytes + col_offset,
                   src + static_cast<std::size_t>(src_row) * row_bytes + col_offset, col_bytes, lane);
          if (paced) {
            sent += col_bytes;
            if (lane == 0) pace_link(t, start, sent, warp_share);
            __syncwarp();
          }
        }
      }
      running += s.rows;
    }
    __syncthreads();  // every row this CTA stored for the batch is ordered before the releases below

    // 3. the rest of the batch's flags
    raise_flags(raised, listed);
    listed_before += listed;
    __syncthreads();  // all have read s_list before the next batch rewrites it
  }

  // 4. the grid ends when the flags the next phase waits for are raised here: the waits of the
  // first GEMM0 tile, or of every combine task (a run of tasks with the same waits once)
  if (blockIdx.x != 0 || a.drain == SegmentDrain::None) return;
  const bool tiles = a.drain == SegmentDrain::GemmTiles;
  const std::uint32_t tasks = tiles ? min(plan.tiles.count, 1u) : plan.combines.count;
  std::uint32_t last_begin = 0, last_count = 0;
  for (std::uint32_t task = 0; task < tasks; ++task) {
    const std::uint32_t wait_begin = tiles ? plan.tiles.data[task].wait_begin : plan.combines.data[task].wait_begin;
    const std::uint32_t wait_count = tiles ? plan.tiles.data[task].wait_count : plan.combines.data[task].wait_count;
    if (task > 0 && wait_begin == last_begin && wait_count == last_count) continue;
    last_begin = wait_begin;
    last_count = wait_count;
    if (wait_begin + static_cast<std::uint64_t>(wait_count) > plan.waits.count) {
      if (tid == 0) record_invalid(t, a, me, static_cast<std::uint64_t>(plan.segments.count) + wait_begin, epoch);
      return;
    }
    for (std::uint32_t i = static_cast<std::uint32_t>(tid); i < wait_count; i += kThreads) {
      const FlagWait w = plan.waits.data[wait_begin + i];
      if (!flag_held(static_cast<std::int32_t>(w.flag), a.layout) || w.from_rank < 0 || w.from_rank >= N) {
        record_invalid(t, a, me, static_cast<std::uint64_t>(plan.segments.count) + wait_begin + i, epoch);
        continue;
      }
      wait_peer(t, region_at<std::uint64_t>(t, me, a.layout.segment_flags) + w.flag, kGinSegmentFlagSignal + w.flag,
                epoch * w.expected * static_cast<std::uint64_t>(a.ctas_per_peer), w.from_rank, drain_subject(a.drain), epoch);
    }
  }
}

}  // namespace

void launch_segment_copy(cudaStream_t stream, const DeviceTransport& t, const SegmentCopyArgs& a) {
  if (t.world < 1 || t.world > kMaxRanks || t.rank < 0 || t.rank >= t.world) throw_internal("segment copy: bad transport ranks");
  if (a.plan == nullptr || a.epoch == nullptr || a.ctas_per_peer < 1 || a.hidden % 8 != 0 || a.first_segment < 0 ||
      a.segment_count < 0) {
    throw_internal("segment copy: bad arguments");
  }
  if (a.packed_ctas < 0 || (a.packed_ctas > 0 && a.ctas_per_peer != 1)) throw_internal("segment copy: packed CTAs need one CTA per peer");
  for (int r = 0; a.packed_ctas > 0 && r < t.world; ++r) {
    if (t.region[r] == nullptr) throw_internal("segment copy: packed CTAs need load/store peers");
  }
  if (a.gather_rows != nullptr && (t.gin_comm != nullptr || a.gather_room < 0)) {
    throw_internal("segment copy: a gather table needs load/store peers (a put sends contiguous rows)");
  }
  if (t.gin_comm != nullptr) {  // puts read the window: whatever a segment reads must live in the region
    for (const SegmentBuffer& b : a.buffers) {
      if (b.local != nullptr && (b.local < t.region[t.rank] || b.local >= t.region[t.rank] + a.layout.bytes)) {
        throw_internal("segment copy: with GIN peers the rows sent must be the region's (puts read the window)");
      }
    }
  }
  const int ctas = a.packed_ctas > 0 ? a.packed_ctas : t.world * a.ctas_per_peer;
  segment_copy_kernel<<<ctas, kThreads, 0, stream>>>(t, a);
  TILEMOE_CUDA_CHECK_LAUNCH("segment copy");
}

int segment_copy_ctas_per_sm() {
  int ctas = 0;
  TILEMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, segment_copy_kernel, kThreads, 0));
  return ctas;
}

}  // namespace tilemoe::cuda
