#include "send_lists.hpp"

#include <cub/block/block_scan.cuh>

#include "comm/cuda/device_sync.cuh"
#include "exec/cuda/kept_rows.cuh"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

constexpr int kListThreads = 1024;
constexpr int kPlacementThreads = 256;
static_assert(kMaxRanks <= 32, "a token's destinations are a 32-bit mask");

// The other ranks holding any of token t's kept experts, a bit each.
__device__ inline unsigned destinations(const SendListArgs& a, int t, int me) {
  unsigned mask = 0;
  for (int j = 0; j < a.top_k; ++j) {
    const int slot = t * a.top_k + j, d = a.expert[slot] / a.local_experts;
    if (d != me && a.row_of_slot[slot] >= 0) mask |= 1u << d;
  }
  return mask;
}

// One CTA; each thread a run of consecutive tokens, so that one exclusive scan per destination
// over the threads' counts gives every token's position in the list (tokens ascending).
__global__ void __launch_bounds__(kListThreads) send_lists_kernel(int world, int me, SendListArgs a) {
  using Scan = cub::BlockScan<int, kListThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int s_total[kMaxRanks];
  const int tid = static_cast<int>(threadIdx.x), kept = *a.kept_rows;
  const int per = (a.tokens + kListThreads - 1) / kListThreads;
  const int first = min(tid * per, a.tokens), last = min(first + per, a.tokens);
  int mine[kMaxRanks];
  for (int d = 0; d < world; ++d) mine[d] = 0;
  for (int t = first; t < last; ++t) {
    const unsigned mask = destinations(a, t, me);
    for (int d = 0; d < world; ++d) mine[d] += (mask >> d) & 1u;
  }
  for (int d = 0; d < world; ++d) {  // mine[d] becomes this thread's first position in d's list
    int total = 0;
    Scan(scan).ExclusiveSum(mine[d], mine[d], total);
    if (tid == 0) s_total[d] = total;
    __syncthreads();  // the temp storage is reused by the next scan
  }
  int list_begin[kMaxRanks];  // where d's list starts in the gather table: after the permuted order's kept rows
  int running = kept;
  for (int d = 0; d < world; ++d) {
    list_begin[d] = running;
    running += s_total[d];
  }
  for (int t = first; t < last; ++t) {
    const unsigned mask = destinations(a, t, me);
    for (int d = 0; d < world; ++d) {
      int position = -1;
      if ((mask >> d) & 1u) {
        position = mine[d]++;
        const std::int64_t entry = static_cast<std::int64_t>(list_begin[d]) + position;
        if (entry < a.gather_room) a.gather_rows[entry] = t;  // (the layout's room holds every list)
      }
      a.list_position[t * world + d] = position;
    }
  }
  for (int row = tid; row < kept && row < a.gather_room; row += kListThreads) a.gather_rows[row] = a.slot_of_row[row] / a.top_k;
  if (tid < world) a.rank_tokens[tid] = s_total[tid];
}

// A thread per permuted row of this rank: rows of another rank's experts write their placement
// entry there (see the header).
__global__ void __launch_bounds__(kPlacementThreads) placements_kernel(DeviceTransport t, PlacementArgs a) {
  const plan_detail::StepCounts& c = a.counts;
  const int me = t.rank, row = kept_row_of_thread(t, c, a.tokens * a.top_k);
  if (row < 0) return;
  const int slot = a.slot_of_row[row], x = a.expert[slot], d = x / c.local_experts;
  if (d == me) return;
  const int token = slot / a.top_k;
  const std::int64_t entry = static_cast<std::int64_t>(c.placement_begin(d)) + plan_detail::expert_in_row(c, a.order, me, x, row);
  const int position = a.list_position[token * c.world + d];
  if (position < 0 || entry < 0 || entry >= a.layout.gather_room) {  // counts and lists disagree: not this rank's routing
    record_failure(t, comm::WaitState::PlanInvalid, d, comm::WaitSubject::DispatchRows, static_cast<std::uint64_t>(entry),
                   static_cast<std::uint64_t>(row), 0, *a.epoch);
    return;
  }
  region_at<int>(t, d, a.layout.gather_rows)[entry] = c.received_row(d, me) + position;
  __threadfence_system();  // before the segment copy's release of the rows' arrival (a later kernel)
}

}  // namespace

void launch_send_lists(cudaStream_t stream, const DeviceTransport& t, const SendListArgs& a) {
  if (t.world < 1 || t.world > kMaxRanks || a.tokens < 0 || a.top_k < 1 || a.local_experts < 1 || a.gather_rows == nullptr ||
      a.rank_tokens == nullptr || a.list_position == nullptr || a.row_of_slot == nullptr || a.kept_rows == nullptr) {
    throw_internal("send lists: bad arguments");
  }
  send_lists_kernel<<<1, kListThreads, 0, stream>>>(t.world, t.rank, a);
  TILEMOE_CUDA_CHECK_LAUNCH("send lists");
}

void launch_write_placements(cudaStream_t stream, const DeviceTransport& t, const PlacementArgs& a) {
  if (a.layout.gather_rows == 0 || a.counts.rank_tokens == nullptr || a.epoch == nullptr) throw_internal("placements: bad arguments");
  const int slots = a.tokens * a.top_k;
  if (slots == 0) return;
  placements_kernel<<<(slots + kPlacementThreads - 1) / kPlacementThreads, kPlacementThreads, 0, stream>>>(t, a);
  TILEMOE_CUDA_CHECK_LAUNCH("placements");
}

}  // namespace tilemoe::cuda
