// The tile-signal combine overlap (ICPP 2026; systems.md section 1) as a plan of the CPU engine,
// the same schedule the GPU builds (band_order.hpp; gpu_schedule.cu on the device):
//
// Dispatch and GEMM0 run as in `sequential`, and so do the rows: each local expert's rows grouped
// by source rank, ascending, no padding. A band is tile_m consecutive rows of one expert (it may
// hold rows of several owners). GEMM1 runs in the planned GEMM's table order (1x2 cluster
// items, each expert's bands in blocks of band_block), the items holding other ranks' rows
// first, and every tile raises its band's flag; a band is ready when all its column tiles have.
// Communication workers take the bands in the same remote-first order, bands_per_segment at a
// time: a segment waits for its bands and ships each band's rows to their owners (a piece per
// owner). An owner combines a token chunk as soon as the pieces carrying its rows have landed.
#include <algorithm>
#include <map>
#include <utility>

#include "band_order.hpp"
#include "defaults.hpp"
#include "plan/plan_builder.hpp"
#include "strategies/strategies.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::plan_detail {

std::vector<StepPlan> compile_tile_signal(const EpWorld& world, const std::vector<Routing>& routing,
                                          const PlanOptions& options) {
  const int world_size = world.world_size();
  if (options.tile_m > (1 << 20) || options.tile_n > (1 << 20)) throw_bad_input("tile_signal: tiles of at most 2^20 rows and columns");
  const int tile_m = static_cast<int>(options.tile_m), tile_n = static_cast<int>(options.tile_n);
  std::vector<StepPlan> plans = empty_plans(Strategy::TileSignal, world, options);
  const StepLayout layout = build_layout(world, routing, SourceOrder::Ascending, 1);
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

    // the row tables the GPU's dispatch writes: rows per local expert, and per (expert, source)
    const int L = static_cast<int>(rl.experts.size());
    std::vector<int> row_offset(static_cast<std::size_t>(L) + 1, 0);
    std::vector<int> block_offset(static_cast<std::size_t>(L * world_size) + 1, 0);
    std::map<std::pair<int, int>, const TokenGroup*> group_of;  // (expert, source) -> its rows
    for (const TokenGroup& g : rl.groups) group_of[{g.local_expert, g.src_rank}] = &g;
    for (int le = 0; le < L; ++le) {
      row_offset[static_cast<std::size_t>(le)] = static_cast<int>(rl.experts[static_cast<std::size_t>(le)].row_begin);
      int row = row_offset[static_cast<std::size_t>(le)];
      for (int q = 0; q < world_size; ++q) {
        block_offset[static_cast<std::size_t>(le * world_size + q)] = row;
        if (auto it = group_of.find({le, q}); it != group_of.end()) row += static_cast<int>(it->second->rows);
      }
    }
    row_offset[static_cast<std::size_t>(L)] = static_cast<int>(rl.expert_rows);
    block_offset[static_cast<std::size_t>(L * world_size)] = static_cast<int>(rl.expert_rows);
    const cuda::TileSignalTables tables = cuda::tile_signal_tables(
        row_offset, block_offset, world_size, rank, static_cast<int>(plan.hidden), options.tile_signal.band_block, tile_m, tile_n);

    // GEMM1 in the table's order; each band's flag counts its column tiles
    std::map<int, std::uint32_t> band_flag;  // band id -> plan flag
    std::map<int, std::uint32_t> band_tiles;
    for (const cuda::GemmTileEntry& e : tables.gemm1) {
      if (e.rows == 0) continue;  // a cluster mate's padding: no work
      auto [it, added] = band_flag.try_emplace(e.flag, 0u);
      if (added) it->second = new_flag(plan);
      GemmTile tile;
      tile.layer = 1;
      tile.expert = e.group;
      tile.row_begin = e.row_begin;
      tile.row_end = e.row_begin + e.rows;
      tile.col_begin = static_cast<std::int64_t>(e.col_tile) * tile_n;
      tile.col_end = std::min<std::int64_t>(tile.col_begin + tile_n, plan.hidden);
      tile.signal_flag = static_cast<std::int32_t>(it->second);
      ++band_tiles[e.flag];
      add_tile(plan, tile, gemm0_done);
    }

    // the consumer's segments: bands_per_segment bands of the band list at a time, each band's
    // rows to their owners, a piece per owner, after all the segment's bands are ready
    const std::size_t per = static_cast<std::size_t>(cpu_bands_per_segment(options.tile_signal));
    for (std::size_t first = 0; first < tables.bands.size(); first += per) {
      const std::size_t end = std::min(tables.bands.size(), first + per);
      std::vector<FlagWait> ready;
      for (std::size_t b = first; b < end; ++b) {
        const int id = tables.bands[b].id;
        ready.push_back({band_flag.at(id), band_tiles.at(id), rank});
      }
      for (std::size_t b = first; b < end; ++b) {
        const cuda::TileBand& band = tables.bands[b];
        for (int q = 0; q < world_size; ++q) {
          const int lo = std::max(band.row_begin, block_offset[static_cast<std::size_t>(band.group * world_size + q)]);
          const int hi = std::min(band.row_begin + band.rows, block_offset[static_cast<std::size_t>(band.group * world_size + q + 1)]);
          if (lo >= hi) continue;
          const TokenGroup& group = *group_of.at({band.group, q});
          Segment segment;
          segment.src = BufferId::ExpertOut;
          segment.dst = BufferId::CombineIn;
          segment.dest_rank = q;
          segment.rows = hi - lo;
          segment.src_row = lo;
          segment.dst_row = group.combine_row + (lo - group.row_begin);
          segment.col_begin = 0;
          segment.col_end = plan.hidden;
          segment.dest_flag = static_cast<std::int32_t>(new_flag(plans[static_cast<std::size_t>(q)]));
          add_segment(plan, segment, ready);
        }
      }
    }
  }

  // Each owner combines a token chunk once the pieces carrying its rows have landed.
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
