// The sequential strategy (the Megatron / Tutel baseline): the whole dispatch all-to-all,
// then every expert's GEMM0, then every GEMM1, then the whole combine all-to-all, then the
// top-k weighted sum. Each phase waits for all of the phase before it: no overlap at all.
#include <map>
#include <utility>

#include "plan/plan_builder.hpp"
#include "strategies/strategies.hpp"

namespace tilemoe::plan_detail {

namespace {

// Counter flag raised by every task of a phase; waiting for its full count ends the phase.
struct PhaseCounter {
  std::uint32_t flag = 0;
  std::uint32_t signals = 0;
  std::vector<FlagWait> waits(int rank) const {
    if (signals == 0) return {};
    return {FlagWait{flag, signals, rank}};
  }
};

}  // namespace

std::vector<StepPlan> compile_sequential(const EpWorld& world, const std::vector<Routing>& routing,
                                         const PlanOptions& options) {
  const int world_size = world.world_size();
  std::vector<StepPlan> plans = empty_plans(Strategy::Sequential, world, options);
  const StepLayout layout = build_layout(world, routing, SourceOrder::Ascending, 1);
  apply_layout(plans, layout, routing);
  add_alltoall_dispatch(plans, layout);

  // combine: one counter per (owner, expert rank)
  std::map<std::pair<int, int>, std::uint32_t> combine_flag;
  for (int rank = 0; rank < world_size; ++rank) {
    StepPlan& plan = plans[static_cast<std::size_t>(rank)];
    const RankLayout& rl = layout.ranks[static_cast<std::size_t>(rank)];
    const std::vector<FlagWait> dispatch_done = all_arrivals(plans, rank, BufferId::ExpertIn);

    PhaseCounter gemm0{new_flag(plan)}, gemm1{new_flag(plan)};
    for (int layer = 0; layer < 2; ++layer) {
      PhaseCounter& counter = layer == 0 ? gemm0 : gemm1;
      const std::int64_t cols = layer == 0 ? plan.ffn_hidden : plan.hidden;
      const std::vector<FlagWait> waits = layer == 0 ? dispatch_done : gemm0.waits(rank);
      for (std::size_t le = 0; le < rl.experts.size(); ++le) {
        for (RowRange band : split_range(rl.experts[le].row_begin, rl.experts[le].row_end, options.tile_m)) {
          for (RowRange col : split_range(0, cols, options.tile_n)) {
            GemmTile tile;
            tile.layer = static_cast<std::uint8_t>(layer);
            tile.expert = static_cast<std::int32_t>(le);
            tile.row_begin = band.begin;
            tile.row_end = band.end;
            tile.col_begin = col.begin;
            tile.col_end = col.end;
            tile.signal_flag = static_cast<std::int32_t>(counter.flag);
            ++counter.signals;
            add_tile(plan, tile, waits);
          }
        }
      }
    }

    // combine all-to-all: every group's rows back to their owner, after all of GEMM1
    for (const TokenGroup& group : rl.groups) {
      Segment segment;
      segment.src = BufferId::ExpertOut;
      segment.dst = BufferId::CombineIn;
      segment.dest_rank = group.src_rank;
      segment.rows = group.rows;
      segment.src_row = group.row_begin;
      segment.dst_row = group.combine_row;
      segment.col_begin = 0;
      segment.col_end = plan.hidden;
      auto [it, added] = combine_flag.try_emplace({group.src_rank, rank}, 0u);
      if (added) it->second = new_flag(plans[static_cast<std::size_t>(group.src_rank)]);
      segment.dest_flag = static_cast<std::int32_t>(it->second);
      add_segment(plan, segment, gemm1.waits(rank));
    }
  }

  // the top-k sum on each owner, after the whole combine all-to-all has landed
  for (int owner = 0; owner < world_size; ++owner) {
    StepPlan& plan = plans[static_cast<std::size_t>(owner)];
    const std::vector<FlagWait> combine_done = all_arrivals(plans, owner, BufferId::CombineIn);
    for (RowRange chunk : token_chunks(plan, options)) {
      const std::uint32_t index =
          add_combine(plan, CombineTask{chunk.begin, chunk.end, 0, plan.hidden}, combine_done);
      plan.compute_queue.push_back({TaskKind::Combine, index});
    }
  }
  return plans;
}

}  // namespace tilemoe::plan_detail
