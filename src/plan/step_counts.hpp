#pragma once
// What a plan compiler reads: every rank's per-expert row counts (a real step has them after the
// count exchange), and the row offsets that follow from them. One header for the host and the
// device, so that a plan compiled on either side from the same counts is the same plan.
//
// Rows follow from counts alone:
//  - a rank's permuted order (its send rows, and its CombineIn, where its rows come back): global
//    expert ascending, the rank's tokens ascending inside an expert; `offset(q, x)` is rank q's
//    first row of global expert x;
//  - a rank's ExpertIn: local expert ascending, and inside an expert the source ranks
//    ascending; `block_row(d, e, q)` is where source q's rows of rank d's local expert e start
//    (comet's: the sources in ring order from d, d itself first, `ring_block_row`);
//  - with a dispatch once per destination rank (DispatchVolume::OncePerRank), rank d's Received:
//    source block after source block, ascending, each source's tokens ascending; rank q sends
//    d `tokens_to(q, d)` rows, one per token that chose any of d's experts (none to itself:
//    its own rows go straight into its ExpertIn).
//
// The gather table of a rank's plan (StepPlan::gather_rows) follows from the same counts: its
// permuted order (the tokens of its send rows, offset_of), then with OncePerRank the tokens it
// sends each destination (destinations ascending, from send_list_begin), then for each of its
// ExpertIn rows the Received row it is placed from (from placement_begin; rows of its own
// tokens have no entry used).
#include <cstdint>

#include "core/host_device.hpp"
#include "tilemoe/plan.hpp"

namespace tilemoe::plan_detail {

struct StepCounts {
  int world = 0;
  int experts = 0;        // global experts, world * local_experts
  int local_experts = 0;
  const int* offset = nullptr;    // [world][experts + 1]
  const int* rank_row = nullptr;  // [world][local_experts + 1]: rank d's local expert e starts at
                                  // row rank_row[d * (L + 1) + e] of d's ExpertIn; e = L: d's rows
  // [world][world]: tokens of rank q that chose any expert of rank d (a kept row), 0 for d = q;
  // null when the dispatch sends a row per expert (no compiler reads it then)
  const int* rank_tokens = nullptr;

  TILEMOE_HOST_DEVICE int offset_of(int q, int x) const { return offset[q * (experts + 1) + x]; }
  TILEMOE_HOST_DEVICE int count(int q, int x) const { return offset_of(q, x + 1) - offset_of(q, x); }
  TILEMOE_HOST_DEVICE int expert_row(int d, int e) const { return rank_row[d * (local_experts + 1) + e]; }
  TILEMOE_HOST_DEVICE int expert_rows(int d) const { return expert_row(d, local_experts); }
  TILEMOE_HOST_DEVICE int local_rows(int d, int e) const { return expert_row(d, e + 1) - expert_row(d, e); }
  TILEMOE_HOST_DEVICE int block_row(int d, int e, int q) const {
    int row = expert_row(d, e);
    for (int p = 0; p < q; ++p) row += count(p, d * local_experts + e);
    return row;
  }
  TILEMOE_HOST_DEVICE int tokens_to(int q, int d) const { return rank_tokens[q * world + d]; }
  // Rows of rank d's Received, and where source q's block starts in it.
  TILEMOE_HOST_DEVICE int received_rows(int d) const { return received_row(d, world); }
  TILEMOE_HOST_DEVICE int received_row(int d, int q) const {
    int row = 0;
    for (int p = 0; p < q; ++p) row += tokens_to(p, d);
    return row;
  }
  // Rank q's gather table: its send lists start after its permuted order; the list for d after
  // those for the destinations before d; then its placements, one entry per ExpertIn row.
  TILEMOE_HOST_DEVICE int send_list_begin(int q) const { return offset_of(q, experts); }
  TILEMOE_HOST_DEVICE int send_list_row(int q, int d) const {
    int row = send_list_begin(q);
    for (int p = 0; p < d; ++p) row += tokens_to(q, p);
    return row;
  }
  TILEMOE_HOST_DEVICE int placement_begin(int q) const { return send_list_row(q, world); }
  // The same with d's sources in ring order: d, d + 1, ..., d - 1.
  TILEMOE_HOST_DEVICE int ring_block_row(int d, int e, int q) const {
    int row = expert_row(d, e);
    for (int p = d; p != q; p = (p + 1) % world) row += count(p, d * local_experts + e);
    return row;
  }
  // How many local experts of rank `d` hold rows of source `q`: the segments q sends d in a
  // dispatch, and d sends back to q in a combine.
  TILEMOE_HOST_DEVICE int groups_from(int q, int d) const {
    int groups = 0;
    for (int e = 0; e < local_experts; ++e) groups += count(q, d * local_experts + e) > 0 ? 1 : 0;
    return groups;
  }
};

// How a strategy lays out each expert's rows in ExpertIn, and the order its dispatch sends in.
enum class DispatchOrder : std::uint8_t {
  // sources ascending (block_row); rank r sends to r, r + 1, ... (sequential, tile_signal)
  Ascending,
  // sources in ring order from the expert rank, itself first (ring_block_row); rank r sends to
  // r, r - 1, ..., so that rank r + i's rows land i-th (comet)
  Ring,
};
TILEMOE_HOST_DEVICE inline int dispatch_block_row(const StepCounts& c, DispatchOrder order, int d, int e, int q) {
  return order == DispatchOrder::Ring ? c.ring_block_row(d, e, q) : c.block_row(d, e, q);
}
// Where rank q's permuted row `row`, one of global expert x's, sits in the ExpertIn of x's rank.
TILEMOE_HOST_DEVICE inline int expert_in_row(const StepCounts& c, DispatchOrder order, int q, int x, int row) {
  return dispatch_block_row(c, order, x / c.local_experts, x % c.local_experts, q) + (row - c.offset_of(q, x));
}
// The destination of rank r's step-th send, and the source whose rows land step-th at rank r.
TILEMOE_HOST_DEVICE inline int dispatch_destination(DispatchOrder order, int r, int step, int world) {
  return order == DispatchOrder::Ring ? (r - step % world + world) % world : (r + step) % world;
}
TILEMOE_HOST_DEVICE inline int dispatch_arrival(DispatchOrder order, int r, int step, int world) {
  return dispatch_destination(order == DispatchOrder::Ring ? DispatchOrder::Ascending : DispatchOrder::Ring, r, step, world);
}

// The last entry e of [0, experts) with value(e) <= index, where value is a prefix sum (entries
// with nothing share their successor's value): which expert, band or group an index falls in.
template <typename Value>
TILEMOE_HOST_DEVICE inline int expert_at(int experts, int index, Value value) {
  int lo = 0, hi = experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (value(mid) <= index) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Fills `offset` [world][experts + 1] and `rank_row` [world][local_experts + 1] from
// `counts` [world][experts] (count of rank q's rows for global expert x), on one thread (the
// host's way; a device compiler scans them a warp per rank).
inline void derive_offsets(const int* counts, int world, int experts, int* offset) {
  for (int q = 0; q < world; ++q) {
    int running = 0;
    for (int x = 0; x < experts; ++x) {
      offset[q * (experts + 1) + x] = running;
      running += counts[q * experts + x];
    }
    offset[q * (experts + 1) + experts] = running;
  }
}
inline void derive_rank_rows(const int* offset, int world, int experts, int* rank_row) {
  const int local = experts / world;
  for (int d = 0; d < world; ++d) {
    int running = 0;
    for (int e = 0; e < local; ++e) {
      rank_row[d * (local + 1) + e] = running;
      for (int q = 0; q < world; ++q) {
        running += offset[q * (experts + 1) + d * local + e + 1] - offset[q * (experts + 1) + d * local + e];
      }
    }
    rank_row[d * (local + 1) + local] = running;
  }
}

constexpr int kExpertsTable = 0, kWaitsTable = 1, kTilesTable = 2, kSegmentsTable = 3, kCombinesTable = 4,
              kComputeQueueTable = 5, kCommQueueTable = 6;

// Empties every table of a plan (their room stays).
TILEMOE_HOST_DEVICE inline void clear_plan(PlanTables& plan) {
  plan.header = PlanHeader{};
  plan.experts.count = plan.waits.count = plan.tiles.count = plan.segments.count = plan.combines.count = 0;
  plan.compute_queue.count = plan.comm_queue.count = 0;
}

TILEMOE_HOST_DEVICE inline std::int64_t ceil_div64(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The entries a compiler writes into each table of `out` (the compute queue holds the tiles and
// then the combines, the comm queue the segments; with `combines_on_comm` the compute queue the
// tiles and the comm queue the segments and the combines), and which tables have room for them: a
// table without room is written by no lane.
struct PlanSize {
  std::int64_t entries[kPlanTableCount] = {};
  bool fits[kPlanTableCount] = {};
};
TILEMOE_HOST_DEVICE inline PlanSize plan_size(const PlanTables& out, std::int64_t experts, std::int64_t waits, std::int64_t tiles,
                                              std::int64_t segments, std::int64_t combines, bool combines_on_comm = false) {
  PlanSize size;
  const std::int64_t compute = combines_on_comm ? tiles : tiles + combines, comm = combines_on_comm ? segments + combines : segments;
  const std::int64_t entries[kPlanTableCount] = {experts, waits, tiles, segments, combines, compute, comm};
  const std::uint32_t room[kPlanTableCount] = {out.experts.capacity,  out.waits.capacity,         out.tiles.capacity,
                                               out.segments.capacity, out.combines.capacity,      out.compute_queue.capacity,
                                               out.comm_queue.capacity};
  for (int t = 0; t < kPlanTableCount; ++t) {
    size.entries[t] = entries[t];
    size.fits[t] = entries[t] <= static_cast<std::int64_t>(room[t]);
  }
  return size;
}

// Lane 0's end of a compile: the header and counts cleared, then a step whose rows exceed the
// layer's room marked (before the room: the layer sized the room for the rows it can hold), or
// the first table without room named, or every table's count set. True when the plan is whole
// and the compiler fills the rest of its header.
TILEMOE_HOST_DEVICE inline bool finish_plan(PlanTables& out, const PlanSize& size, bool rows_fit) {
  clear_plan(out);
  if (!rows_fit) {
    out.header.rows_exceed_room = 1;
    return false;
  }
  for (int t = 0; t < kPlanTableCount; ++t) {
    if (!size.fits[t]) {
      out.header.overflow = static_cast<std::uint32_t>(t + 1);
      return false;
    }
  }
  const auto n = [&](int t) { return static_cast<std::uint32_t>(size.entries[t]); };
  out.experts.count = n(kExpertsTable);
  out.waits.count = n(kWaitsTable);
  out.tiles.count = n(kTilesTable);
  out.segments.count = n(kSegmentsTable);
  out.combines.count = n(kCombinesTable);
  out.compute_queue.count = n(kComputeQueueTable);
  out.comm_queue.count = n(kCommQueueTable);
  return true;
}

}  // namespace tilemoe::plan_detail
