// The sequential strategy (the Megatron / Tutel baseline) on the host: the same compiler the GPU
// runs (sequential_plan.hpp), from the counts of the routing, then the per-token tables.
#include <vector>

#include "plan/plan_builder.hpp"
#include "plan/plan_tables.hpp"
#include "sequential_plan.hpp"
#include "strategies/strategies.hpp"

namespace tilemoe::plan_detail {

std::vector<StepPlan> compile_sequential(const EpWorld& world, const std::vector<Routing>& routing,
                                         const PlanOptions& options) {
  SequentialShape tiling;
  tiling.tile_m = options.tile_m;
  tiling.tile_n[0] = tiling.tile_n[1] = options.tile_n;
  tiling.combine_tokens = options.combine_tokens;
  tiling.dispatch = options.dispatch;
  return compile_sequential_at(world, routing, options, tiling);
}

std::vector<StepPlan> compile_sequential_at(const EpWorld& world, const std::vector<Routing>& routing, const PlanOptions& options,
                                            const SequentialShape& tiling) {
  const int world_size = world.world_size();
  const int experts = static_cast<int>(world.layer.num_experts);
  const HostStepCounts counts = routing_counts(routing, experts);
  std::vector<StepPlan> plans = empty_plans(Strategy::Sequential, world, options);
  for (int rank = 0; rank < world_size; ++rank) {
    StepPlan& plan = plans[static_cast<std::size_t>(rank)];
    SequentialShape shape = tiling;
    shape.rank = rank;
    shape.tokens = plan.tokens;
    shape.hidden = plan.hidden;
    shape.ffn_hidden = plan.ffn_hidden;
    plan.tile_m = shape.tile_m;
    plan.tile_n0 = shape.tile_n[0];
    plan.tile_n1 = shape.tile_n[1];
    HostPlanTables tables(sequential_capacity(world_size, counts.view().local_experts, counts.view().expert_rows(rank),
                                              plan.tokens, shape));
    std::vector<int> tile_first(static_cast<std::size_t>(sequential_prefix_size(counts.view().local_experts)));
    sequential_prefix(counts.view(), shape, tile_first.data());
    compile_sequential_tables(counts.view(), shape, tile_first.data(), tables.view());
    copy_plan_tables(tables.view(), plan);
    add_token_tables(plan, routing, counts, shape.dispatch, DispatchOrder::Ascending, world.layer.router.scales_input);
  }
  return plans;
}

}  // namespace tilemoe::plan_detail
