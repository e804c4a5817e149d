#include "plan_builder.hpp"

namespace tilemoe::plan_detail {

StepPlan empty_plan(Strategy strategy, const EpWorld& world, int rank, const PlanOptions& options) {
  StepPlan plan;
  plan.strategy = strategy;
  plan.rank = rank;
  plan.world_size = world.world_size();
  plan.tokens = world.tokens_per_rank[static_cast<std::size_t>(rank)];
  plan.hidden = world.layer.hidden;
  plan.ffn_hidden = world.layer.ffn_hidden;
  plan.top_k = world.layer.top_k;
  plan.activation = world.layer.activation;
  plan.dtype = world.layer.dtype;
  plan.compute_workers = options.compute_workers;
  plan.comm_workers = options.comm_workers;
  plan.tile_m = options.tile_m;
  plan.tile_n0 = options.tile_n;
  plan.tile_n1 = options.tile_n;
  return plan;
}

std::vector<StepPlan> empty_plans(Strategy strategy, const EpWorld& world, const PlanOptions& options) {
  std::vector<StepPlan> plans;
  for (int rank = 0; rank < world.world_size(); ++rank) plans.push_back(empty_plan(strategy, world, rank, options));
  return plans;
}

}  // namespace tilemoe::plan_detail
