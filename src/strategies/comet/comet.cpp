// COMET on the host: the same compiler a GPU is to run (comet_plan.hpp), from the counts of the
// routing, then the per-token tables.
#include <algorithm>
#include <vector>

#include "comet_plan.hpp"
#include "plan/plan_builder.hpp"
#include "plan/plan_tables.hpp"
#include "strategies/strategies.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::plan_detail {

namespace {

// The column split: the option's, or a quarter of hidden rounded up to whole tiles.
std::int64_t split_columns(const PlanOptions& options, std::int64_t hidden) {
  if (options.comet.split_cols > 0) return options.comet.split_cols;
  const std::int64_t quarter = (hidden + 3) / 4;
  return std::max(options.tile_n, (quarter + options.tile_n - 1) / options.tile_n * options.tile_n);
}

}  // namespace

std::vector<StepPlan> compile_comet(const EpWorld& world, const std::vector<Routing>& routing,
                                    const PlanOptions& options) {
  CometShape tiling;
  tiling.gemm.tile_m = options.tile_m;
  tiling.gemm.tile_n[0] = tiling.gemm.tile_n[1] = options.tile_n;
  tiling.gemm.combine_tokens = options.combine_tokens;
  tiling.gemm.dispatch = options.dispatch;
  tiling.split_cols = split_columns(options, world.layer.hidden);
  return compile_comet_at(world, routing, options, tiling);
}

std::vector<StepPlan> compile_comet_at(const EpWorld& world, const std::vector<Routing>& routing, const PlanOptions& options,
                                       const CometShape& tiling) {
  if (tiling.gemm.cluster == cuda::PlannedCluster::M2) throw_internal("comet: its tile order pairs tiles along columns (1x2) or not at all");
  if (tiling.split_cols < 1) throw_internal("comet: a split needs at least one column");
  const int world_size = world.world_size();
  const HostStepCounts counts = routing_counts(routing, static_cast<int>(world.layer.num_experts));
  const StepCounts view = counts.view();
  std::vector<StepPlan> plans = empty_plans(Strategy::Comet, world, options);
  for (int rank = 0; rank < world_size; ++rank) {
    StepPlan& plan = plans[static_cast<std::size_t>(rank)];
    CometShape shape = tiling;
    shape.gemm.rank = rank;
    shape.gemm.tokens = plan.tokens;
    shape.gemm.hidden = plan.hidden;
    shape.gemm.ffn_hidden = plan.ffn_hidden;
    plan.tile_m = shape.gemm.tile_m;
    plan.tile_n0 = shape.gemm.tile_n[0];
    plan.tile_n1 = shape.gemm.tile_n[1];
    HostPlanTables tables(comet_capacity(world_size, view.local_experts, view.expert_rows(rank), plan.tokens, shape));
    std::vector<int> prefix(static_cast<std::size_t>(comet_prefix_size(world_size, view.local_experts, comet_splits(shape))));
    comet_prefix(view, shape, prefix.data());
    compile_comet_tables(view, shape, prefix.data(), tables.view());
    copy_plan_tables(tables.view(), plan);
    add_token_tables(plan, routing, counts, shape.gemm.dispatch, DispatchOrder::Ring, world.layer.router.scales_input);
  }
  return plans;
}

}  // namespace tilemoe::plan_detail
