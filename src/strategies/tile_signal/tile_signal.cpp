// The tile-signal combine overlap (ICPP 2026; systems.md section 1).
//
// Dispatch and GEMM0 run as in `sequential`. Inside each local expert the rows are grouped by
// owner rank, remote owners first, each group padded to tile_m, so every GEMM1 tile has one
// destination. GEMM1 runs remote tiles first (experts with more remote bands first) and raises
// a ready flag per tile; communication workers ship row bands (merged by mgb, the first and
// last segment one band, only real rows) to the owner while later tiles are computed. An
// owner combines a token chunk as soon as the segments carrying its rows have landed.
#include <algorithm>
#include <map>
#include <numeric>
#include <utility>

#include "plan/plan_builder.hpp"
#include "strategies/strategies.hpp"
#include "defaults.hpp"

namespace tilemoe::plan_detail {

namespace {

struct Band {
  std::size_t group = 0;     // index into the rank's groups
  std::int64_t row_begin = 0;
  std::int64_t valid_rows = 0;
  std::vector<std::uint32_t> tile_flags;
};

}  // namespace

std::vector<StepPlan> compile_tile_signal(const EpWorld& world, const std::vector<Routing>& routing,
                                          const PlanOptions& options) {
  const int world_size = world.world_size();
  std::vector<StepPlan> plans = empty_plans(Strategy::TileSignal, world, options);
  const StepLayout layout = build_layout(world, routing, SourceOrder::RemoteFirst, options.tile_m);
  apply_layout(plans, layout, routing);
  add_alltoall_dispatch(plans, layout);

  for (int rank = 0; rank < world_size; ++rank) {
    StepPlan& plan = plans[static_cast<std::size_t>(rank)];
    const RankLayout& rl = layout.ranks[static_cast<std::size_t>(rank)];
    const std::vector<FlagWait> dispatch_done = all_arrivals(plans, rank, BufferId::ExpertIn);

    // GEMM0 + activation, as in sequential
    const std::uint32_t gemm0_flag = new_flag(plan);
    std::uint32_t gemm0_tiles = 0;
    for (std::size_t le = 0; le < rl.experts.size(); ++le) {
      for (RowRange band : split_range(rl.experts[le].row_begin, rl.experts[le].row_end, options.tile_m)) {
        for (RowRange col : split_range(0, plan.ffn_hidden, options.tile_n)) {
          GemmTile tile;
          tile.layer = 0;
          tile.expert = static_cast<std::int32_t>(le);
          tile.row_begin = band.begin;
          tile.row_end = band.end;
          tile.col_begin = col.begin;
          tile.col_end = col.end;
          tile.signal_flag = static_cast<std::int32_t>(gemm0_flag);
          ++gemm0_tiles;
          add_tile(plan, tile, dispatch_done);
        }
      }
    }
    std::vector<FlagWait> gemm0_done;
    if (gemm0_tiles > 0) gemm0_done.push_back({gemm0_flag, gemm0_tiles, rank});

    // Row bands of every group; a group of an owner r' != rank is remote.
    std::vector<std::vector<Band>> remote_bands(rl.experts.size()), local_bands(rl.experts.size());
    for (std::size_t g = 0; g < rl.groups.size(); ++g) {
      const TokenGroup& group = rl.groups[g];
      for (std::int64_t offset = 0; offset < group.padded_rows; offset += options.tile_m) {
        Band band{g, group.row_begin + offset, std::min(options.tile_m, group.rows - offset), {}};
        auto& list = group.src_rank == rank ? local_bands : remote_bands;
        list[static_cast<std::size_t>(group.local_expert)].push_back(band);
      }
    }
    // Remote-first order: experts with more remote bands first, then all local bands.
    std::vector<std::size_t> expert_order(rl.experts.size());
    std::iota(expert_order.begin(), expert_order.end(), std::size_t{0});
    std::stable_sort(expert_order.begin(), expert_order.end(), [&](std::size_t a, std::size_t b) {
      return remote_bands[a].size() > remote_bands[b].size();
    });
    std::vector<Band> schedule;
    for (std::size_t le : expert_order) schedule.insert(schedule.end(), remote_bands[le].begin(), remote_bands[le].end());
    for (std::size_t le : expert_order) schedule.insert(schedule.end(), local_bands[le].begin(), local_bands[le].end());

    // GEMM1: every column tile of a band, band after band, each with its ready flag.
    for (Band& band : schedule) {
      const TokenGroup& group = rl.groups[band.group];
      for (RowRange col : split_range(0, plan.hidden, options.tile_n)) {
        GemmTile tile;
        tile.layer = 1;
        tile.expert = group.local_expert;
        tile.row_begin = band.row_begin;
        tile.row_end = band.row_begin + options.tile_m;
        tile.col_begin = col.begin;
        tile.col_end = col.end;
        tile.signal_flag = static_cast<std::int32_t>(new_flag(plan));
        tile.dest_rank = group.src_rank;
        tile.remote_offset = group.combine_row + (band.row_begin - group.row_begin);
        tile.valid_rows = static_cast<std::int32_t>(band.valid_rows);
        band.tile_flags.push_back(static_cast<std::uint32_t>(tile.signal_flag));
        add_tile(plan, tile, gemm0_done);
      }
    }

    // Consumer segments: consecutive bands of one group, up to mgb of them; the first and
    // the last segment are a single band (early start, short tail).
    const std::size_t mgb = static_cast<std::size_t>(cpu_bands_per_segment(options.tile_signal));
    std::vector<std::pair<std::size_t, std::size_t>> spans;  // [first band, last band + 1)
    for (std::size_t i = 0; i < schedule.size();) {
      std::size_t end = i + 1;
      if (i > 0) {
        while (end < schedule.size() && end - i < mgb &&
               schedule[end].group == schedule[i].group) {
          ++end;
        }
      }
      spans.emplace_back(i, end);
      i = end;
    }
    if (spans.size() > 1 && spans.back().second - spans.back().first > 1) {
      const std::size_t last = spans.back().second - 1;
      spans.back().second = last;
      spans.emplace_back(last, last + 1);
    }
    for (auto [first, end] : spans) {
      const TokenGroup& group = rl.groups[schedule[first].group];
      Segment segment;
      segment.src = BufferId::ExpertOut;
      segment.dst = BufferId::CombineIn;
      segment.dest_rank = group.src_rank;
      segment.src_row = schedule[first].row_begin;
      segment.dst_row = group.combine_row + (schedule[first].row_begin - group.row_begin);
      segment.col_begin = 0;
      segment.col_end = plan.hidden;
      std::vector<FlagWait> ready;
      for (std::size_t b = first; b < end; ++b) {
        segment.rows += schedule[b].valid_rows;
        for (std::uint32_t flag : schedule[b].tile_flags) ready.push_back({flag, 1, rank});
      }
      segment.dest_flag = static_cast<std::int32_t>(new_flag(plans[static_cast<std::size_t>(group.src_rank)]));
      add_segment(plan, segment, ready);
    }
  }

  // Each owner combines a token chunk once the segments carrying its rows have landed.
  for (int owner = 0; owner < world_size; ++owner) {
    StepPlan& plan = plans[static_cast<std::size_t>(owner)];
    const ArrivalIndex arrivals = index_arrivals(plans, owner, BufferId::CombineIn);
    for (RowRange chunk : token_chunks(plan, options)) {
      const std::vector<FlagWait> landed =
          arrival_waits(arrivals, combine_rows_of_tokens(plan, chunk), 0, plan.hidden);
      const std::uint32_t index =
          add_combine(plan, CombineTask{chunk.begin, chunk.end, 0, plan.hidden}, landed);
      plan.compute_queue.push_back({TaskKind::Combine, index});
    }
  }
  return plans;
}

}  // namespace tilemoe::plan_detail
