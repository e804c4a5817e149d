#pragma once
// One plan compiler per strategy; compile_plan() picks one.
#include <vector>

#include "tilemoe/plan.hpp"

namespace tilemoe::plan_detail {

std::vector<StepPlan> compile_sequential(const EpWorld& world, const std::vector<Routing>& routing,
                                         const PlanOptions& options);
std::vector<StepPlan> compile_tile_signal(const EpWorld& world, const std::vector<Routing>& routing,
                                          const PlanOptions& options);
std::vector<StepPlan> compile_comet(const EpWorld& world, const std::vector<Routing>& routing,
                                    const PlanOptions& options);

}  // namespace tilemoe::plan_detail
