#pragma once
// What every strategy's host compile starts from: a rank's plan with the layer's shape and the
// options' workers and tiles, and nothing scheduled (the counts-only compilers fill the tables:
// strategies/*/*_plan.hpp).
#include <vector>

#include "tilemoe/plan.hpp"

namespace tilemoe::plan_detail {

// The plan of one rank with nothing scheduled yet, and those of every rank.
StepPlan empty_plan(Strategy strategy, const EpWorld& world, int rank, const PlanOptions& options);
std::vector<StepPlan> empty_plans(Strategy strategy, const EpWorld& world, const PlanOptions& options);

}  // namespace tilemoe::plan_detail
