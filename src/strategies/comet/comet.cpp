// COMET (MLSys 2025; systems.md section 2), expert-parallel form.
//
// layer0 (dispatch -> GEMM0) is split along tokens: inside each local expert the rows are
// grouped by source rank, this rank's own tokens first, then the others in ring order
// (r+1, r+2, ...), and senders send in the matching order (rank p's step s goes to p - s),
// so GEMM0 starts on local rows at once; each GEMM0 tile waits only for the groups its rows
// come from.
// layer1 (GEMM1 -> top-k reduce + combine) is split along hidden columns: GEMM1 runs one
// column split of T_N columns across all local experts before the next split; as soon as a
// split is done for every expert, communication workers ship those columns to the tokens'
// owners, and the owners' communication workers reduce the top-k outputs of the split.
//
// Where the reduction runs: COMET reduces a token's outputs on the expert side. With expert
// parallelism a token's k experts sit on several ranks, and a partial sum per rank would add
// the k terms in a rank-dependent order. tilemoe's numerics sum a token's terms in top-k slot
// order on every backend, so the reduction of a column split runs on the owner, on its
// communication workers, as soon as that split has landed. The bytes moved equal the
// sequential combine's.
#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>
#include <utility>

#include "plan/plan_builder.hpp"
#include "strategies/strategies.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::plan_detail {

namespace {

std::int64_t split_columns(const PlanOptions& options, std::int64_t hidden) {
  if (options.comet.split_cols > 0) return options.comet.split_cols;
  const std::int64_t quarter = (hidden + 3) / 4;
  return std::max(options.tile_n, (quarter + options.tile_n - 1) / options.tile_n * options.tile_n);
}

}  // namespace

std::vector<StepPlan> compile_comet(const EpWorld& world, const std::vector<Routing>& routing,
                                    const PlanOptions& options) {
  const int world_size = world.world_size();
  std::vector<StepPlan> plans = empty_plans(Strategy::Comet, world, options);
  const StepLayout layout = build_layout(world, routing, SourceOrder::LocalFirstRing, 1);
  apply_layout(plans, layout, routing);

  // dispatch: one flag per group, so a GEMM0 tile waits only for its own source rows (placed
  // from Received by the expert rank itself when the dispatch sends once per rank)
  const auto dest_order = [&](int src, int step) { return (src - step + world_size) % world_size; };
  std::map<std::pair<int, std::size_t>, FlagWait> group_flag;  // (dest, group) -> the flag its rows raise
  const auto arrival_flag = [&](int dest, std::size_t group) {
    auto [it, added] = group_flag.try_emplace({dest, group});
    if (added) {
      const int src = layout.ranks[static_cast<std::size_t>(dest)].groups[group].src_rank;
      const bool placed = options.dispatch == DispatchVolume::OncePerRank && src != dest;
      it->second = FlagWait{new_flag(plans[static_cast<std::size_t>(dest)]), 1, placed ? dest : src};
    }
    return it->second;
  };
  if (options.dispatch == DispatchVolume::OncePerRank) {
    add_dispatch_once_per_rank(plans, layout, dest_order, arrival_flag);
  } else {
    add_dispatch(plans, layout, dest_order, arrival_flag);
  }

  const std::vector<RowRange> splits =
      split_range(0, world.layer.hidden, split_columns(options, world.layer.hidden));
  // (owner, split, expert rank) -> arrival counter on the owner
  std::map<std::tuple<int, std::size_t, int>, std::uint32_t> split_flag;
  std::vector<std::vector<std::vector<std::uint32_t>>> sends_of(static_cast<std::size_t>(world_size));
  std::vector<std::size_t> dispatch_entries(static_cast<std::size_t>(world_size));
  for (int rank = 0; rank < world_size; ++rank) {
    dispatch_entries[static_cast<std::size_t>(rank)] = plans[static_cast<std::size_t>(rank)].comm_queue.size();
  }

  for (int rank = 0; rank < world_size; ++rank) {
    StepPlan& plan = plans[static_cast<std::size_t>(rank)];
    const RankLayout& rl = layout.ranks[static_cast<std::size_t>(rank)];
    const ArrivalIndex arrivals = index_arrivals(plans, rank, BufferId::ExpertIn);

    // GEMM0 bands (tile_m rows across source groups), ordered by the ring position of the
    // latest source they need, so the consumer starts with the rows that land first.
    struct Band {
      std::size_t expert;
      RowRange rows;
      int last_source_position;
      std::uint32_t done_flag = 0;
      std::uint32_t col_tiles = 0;
    };
    std::vector<Band> bands;
    for (std::size_t le = 0; le < rl.experts.size(); ++le) {
      for (RowRange rows : split_range(rl.experts[le].row_begin, rl.experts[le].row_end, options.tile_m)) {
        int last = 0;
        for (const TokenGroup& group : rl.groups) {
          if (group.row_begin < rows.end && group.row_begin + group.rows > rows.begin) {
            last = std::max(last, (group.src_rank - rank + world_size) % world_size);
          }
        }
        bands.push_back({le, rows, last});
      }
    }
    std::stable_sort(bands.begin(), bands.end(), [](const Band& a, const Band& b) {
      return a.last_source_position < b.last_source_position;
    });
    for (Band& band : bands) {
      std::vector<std::int64_t> rows(static_cast<std::size_t>(band.rows.end - band.rows.begin));
      std::iota(rows.begin(), rows.end(), band.rows.begin);
      const std::vector<FlagWait> landed = arrival_waits(arrivals, rows, 0, plan.hidden);
      band.done_flag = new_flag(plan);
      for (RowRange col : split_range(0, plan.ffn_hidden, options.tile_n)) {
        GemmTile tile;
        tile.layer = 0;
        tile.expert = static_cast<std::int32_t>(band.expert);
        tile.row_begin = band.rows.begin;
        tile.row_end = band.rows.end;
        tile.col_begin = col.begin;
        tile.col_end = col.end;
        tile.signal_flag = static_cast<std::int32_t>(band.done_flag);
        ++band.col_tiles;
        add_tile(plan, tile, landed);
      }
    }
    // GEMM1, split by split across all experts; each split's tiles raise the split's counter.
    std::vector<std::uint32_t> split_done(splits.size());
    std::vector<std::uint32_t> split_tiles(splits.size(), 0);
    for (std::size_t s = 0; s < splits.size(); ++s) {
      split_done[s] = new_flag(plan);
      for (std::size_t le = 0; le < rl.experts.size(); ++le) {
        for (const Band& band : bands) {
          if (band.expert != le) continue;
          for (RowRange col : split_range(splits[s].begin, splits[s].end, options.tile_n)) {
            GemmTile tile;
            tile.layer = 1;
            tile.expert = static_cast<std::int32_t>(le);
            tile.row_begin = band.rows.begin;
            tile.row_end = band.rows.end;
            tile.col_begin = col.begin;
            tile.col_end = col.end;
            tile.signal_flag = static_cast<std::int32_t>(split_done[s]);
            ++split_tiles[s];
            add_tile(plan, tile, {FlagWait{band.done_flag, band.col_tiles, rank}});
          }
        }
      }
    }
    // Sends of each split: one segment per (group, split), after the split's GEMM1.
    // Rows of one owner inside an expert are contiguous, so a segment is one block.
    std::vector<std::vector<std::uint32_t>> sends(splits.size());
    for (std::size_t s = 0; s < splits.size(); ++s) {
      std::vector<FlagWait> done;
      if (split_tiles[s] > 0) done.push_back({split_done[s], split_tiles[s], rank});
      for (const TokenGroup& group : rl.groups) {
        Segment segment;
        segment.src = BufferId::ExpertOut;
        segment.dst = BufferId::CombineIn;
        segment.dest_rank = group.src_rank;
        segment.rows = group.rows;
        segment.src_row = group.row_begin;
        segment.dst_row = group.combine_row;
        segment.col_begin = splits[s].begin;
        segment.col_end = splits[s].end;
        auto [it, added] = split_flag.try_emplace({group.src_rank, s, rank}, 0u);
        if (added) it->second = new_flag(plans[static_cast<std::size_t>(group.src_rank)]);
        segment.dest_flag = static_cast<std::int32_t>(it->second);
        sends[s].push_back(add_segment(plan, segment, done));
      }
    }
    sends_of[static_cast<std::size_t>(rank)] = std::move(sends);
  }

  // The owners' reductions, split by split, on the communication workers. Queue order per
  // rank: dispatch, sends of split 0 and 1, reduce 0, sends of split 2, reduce 1, ...: a
  // worker never blocks on a reduction before the next split's sends are queued.
  for (int owner = 0; owner < world_size; ++owner) {
    StepPlan& plan = plans[static_cast<std::size_t>(owner)];
    const ArrivalIndex arrivals = index_arrivals(plans, owner, BufferId::CombineIn);
    std::vector<std::vector<std::uint32_t>> reduces(splits.size());
    for (std::size_t s = 0; s < splits.size(); ++s) {
      for (RowRange chunk : token_chunks(plan, options)) {
        const std::vector<FlagWait> landed =
            arrival_waits(arrivals, combine_rows_of_tokens(plan, chunk), splits[s].begin, splits[s].end);
        reduces[s].push_back(add_combine(
            plan, CombineTask{chunk.begin, chunk.end, splits[s].begin, splits[s].end}, landed));
      }
    }
    const auto& sends = sends_of[static_cast<std::size_t>(owner)];
    plan.comm_queue.resize(dispatch_entries[static_cast<std::size_t>(owner)]);
    for (std::size_t s = 0; s <= splits.size(); ++s) {
      if (s < splits.size()) {
        for (std::uint32_t index : sends[s]) plan.comm_queue.push_back({TaskKind::Segment, index});
      }
      if (s >= 1) {
        for (std::uint32_t index : reduces[s - 1]) plan.comm_queue.push_back({TaskKind::Combine, index});
      }
    }
  }
  return plans;
}

}  // namespace tilemoe::plan_detail
