#pragma once
// The host's side of the fixed-room plan tables (PlanTables, include/tilemoe/plan.hpp): their
// room, storage for a compiler run on the host, the counts a compiler reads, and the step into a
// StepPlan with its per-token tables.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "plan/step_counts.hpp"
#include "tilemoe/plan.hpp"
#include "tilemoe/routing.hpp"

namespace tilemoe::plan_detail {

// Entries each table has room for, in PlanTables' order.
struct PlanCapacity {
  std::array<std::uint32_t, kPlanTableCount> entries{};
};
// The room asked for, or bad input naming the table when it exceeds what a table can index.
PlanCapacity checked_capacity(const std::array<std::int64_t, kPlanTableCount>& entries);

// Vectors holding a plan's tables, and the view a compiler fills.
class HostPlanTables {
 public:
  explicit HostPlanTables(const PlanCapacity& capacity);
  PlanTables& view() { return view_; }

 private:
  std::vector<LocalExpert> experts_;
  std::vector<FlagWait> waits_;
  std::vector<GemmTile> tiles_;
  std::vector<Segment> segments_;
  std::vector<CombineTask> combines_;
  std::vector<TaskRef> compute_queue_, comm_queue_;
  PlanTables view_;
};

// Copies a compiled plan's tables (host memory) and header into `plan`; internal error if a
// table overflowed (the capacity of the compiler's strategy is wrong).
void copy_plan_tables(const PlanTables& tables, StepPlan& plan);

// "" when two plans have the same header fields a compiler writes and the same tables, entry by
// entry; otherwise the first difference ("tiles[12]: row_end 256 / 250"). Per-token tables are
// not compared.
std::string first_table_difference(const StepPlan& a, const StepPlan& b);

// The tokens of rank q that chose any expert of rank d (a kept row), ascending: what a dispatch
// once per destination rank sends (none from a rank to itself). [q][d].
using SendLists = std::vector<std::vector<std::vector<std::int64_t>>>;
SendLists rank_send_lists(const std::vector<Routing>& routing, int experts);

// Every rank's counts, with the offsets a compiler reads (StepCounts views this object: keep it).
class HostStepCounts {
 public:
  // `counts` [world][experts]: rank q's kept rows for global expert x. `rank_tokens`
  // [world][world] (StepCounts::rank_tokens), or empty when no compiler reads it; `send_lists`
  // the lists they count (rank_send_lists), for the per-token tables, or empty.
  HostStepCounts(std::vector<int> counts, int world, int experts, std::vector<int> rank_tokens = {}, SendLists send_lists = {});
  const StepCounts& view() const { return view_; }
  const std::vector<int>& counts() const { return counts_; }
  const SendLists& send_lists() const { return send_lists_; }

 private:
  std::vector<int> counts_, offset_, rank_row_, rank_tokens_;
  SendLists send_lists_;
  StepCounts view_;
};
HostStepCounts routing_counts(const std::vector<Routing>& routing, int experts);

// A rank's per-token tables from every rank's routing (see step_counts.hpp for the layout of
// gather_rows): its permuted order; with a dispatch once per rank its send lists and, for each
// ExpertIn row of another rank's token, the Received row it is placed from; combine_source_row
// (each kept slot's row in the permuted order, which is where its expert output comes back) and
// combine_weight; with `scales_input` (RouterConfig's) each ExpertIn row's input scale, the
// weight of the slot it holds, and combine weights of 1.
void add_token_tables(StepPlan& plan, const std::vector<Routing>& routing, const HostStepCounts& counts, DispatchVolume dispatch,
                      DispatchOrder order, bool scales_input);

}  // namespace tilemoe::plan_detail
