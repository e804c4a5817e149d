#pragma once
// One plan compiler per strategy; compile_plan() picks one.
#include <vector>

#include "tilemoe/plan.hpp"

namespace tilemoe::plan_detail {

std::vector<StepPlan> compile_sequential(const EpWorld& world, const std::vector<Routing>& routing,
                                         const PlanOptions& options);
// The sequential plans at another tiling than the options' (the GPU's: gpu_plan_shape.hpp):
// `tiling`'s tile shape, order and combine tasks; its rank and layer fields are set per rank.
struct SequentialShape;
std::vector<StepPlan> compile_sequential_at(const EpWorld& world, const std::vector<Routing>& routing, const PlanOptions& options,
                                            const SequentialShape& tiling);
std::vector<StepPlan> compile_tile_signal(const EpWorld& world, const std::vector<Routing>& routing,
                                          const PlanOptions& options);
// The same at another tiling (the GPU's), as compile_sequential_at.
struct TileSignalShape;
std::vector<StepPlan> compile_tile_signal_at(const EpWorld& world, const std::vector<Routing>& routing, const PlanOptions& options,
                                             const TileSignalShape& tiling);
std::vector<StepPlan> compile_comet(const EpWorld& world, const std::vector<Routing>& routing,
                                    const PlanOptions& options);
// The same at another tiling (the GPU's: its tile shape, 1x2 pairs and split), as compile_sequential_at.
struct CometShape;
std::vector<StepPlan> compile_comet_at(const EpWorld& world, const std::vector<Routing>& routing, const PlanOptions& options,
                                       const CometShape& tiling);

}  // namespace tilemoe::plan_detail
