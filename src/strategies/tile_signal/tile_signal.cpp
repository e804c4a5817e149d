// tile_signal on the host: the same compiler the GPU is to run (tile_signal_plan.hpp), from the
// counts of the routing, then the per-token tables.
#include <vector>

#include "defaults.hpp"
#include "plan/plan_builder.hpp"
#include "plan/plan_tables.hpp"
#include "strategies/strategies.hpp"
#include "tile_signal_plan.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::plan_detail {

std::vector<StepPlan> compile_tile_signal(const EpWorld& world, const std::vector<Routing>& routing,
                                          const PlanOptions& options) {
  if (options.tile_m > (1 << 20) || options.tile_n > (1 << 20)) throw_bad_input("tile_signal: tiles of at most 2^20 rows and columns");
  TileSignalShape tiling;
  tiling.gemm.tile_m = options.tile_m;
  tiling.gemm.tile_n[0] = tiling.gemm.tile_n[1] = options.tile_n;
  // GEMM1's order is defined on the planned GEMM's 1x2 pairs (the GPU's), so the CPU engine
  // runs the same schedule; GEMM0's tiles take that order too
  tiling.gemm.cluster = cuda::PlannedCluster::N2;
  tiling.gemm.band_block[1] = options.tile_signal.band_block;
  tiling.gemm.combine_tokens = options.combine_tokens;
  tiling.gemm.dispatch = options.dispatch;
  tiling.bands_per_segment = cpu_bands_per_segment(options.tile_signal);
  return compile_tile_signal_at(world, routing, options, tiling);
}

std::vector<StepPlan> compile_tile_signal_at(const EpWorld& world, const std::vector<Routing>& routing, const PlanOptions& options,
                                             const TileSignalShape& tiling) {
  if (tiling.gemm.cluster != cuda::PlannedCluster::N2) throw_internal("tile_signal: GEMM1's order is defined on 1x2 pairs");
  if (tiling.bands_per_segment < 1) throw_internal("tile_signal: a segment needs at least one band");
  const int world_size = world.world_size();
  const HostStepCounts counts = routing_counts(routing, static_cast<int>(world.layer.num_experts));
  const StepCounts view = counts.view();
  std::vector<StepPlan> plans = empty_plans(Strategy::TileSignal, world, options);
  for (int rank = 0; rank < world_size; ++rank) {
    StepPlan& plan = plans[static_cast<std::size_t>(rank)];
    TileSignalShape shape = tiling;
    shape.gemm.rank = rank;
    shape.gemm.tokens = plan.tokens;
    shape.gemm.hidden = plan.hidden;
    shape.gemm.ffn_hidden = plan.ffn_hidden;
    plan.tile_m = shape.gemm.tile_m;
    plan.tile_n0 = shape.gemm.tile_n[0];
    plan.tile_n1 = shape.gemm.tile_n[1];
    HostPlanTables tables(tile_signal_capacity(world_size, view.local_experts, view.expert_rows(rank), plan.tokens, shape.gemm));
    std::vector<int> prefix(static_cast<std::size_t>(tile_signal_prefix_size(view.local_experts)));
    tile_signal_prefix(view, shape.gemm, prefix.data());
    compile_tile_signal_tables(view, shape, prefix.data(), tables.view());
    copy_plan_tables(tables.view(), plan);
    add_token_tables(plan, routing, counts, shape.gemm.dispatch, DispatchOrder::Ascending, world.layer.router.scales_input);
  }
  return plans;
}

}  // namespace tilemoe::plan_detail
