// The plan compilers: the structure each strategy promises, and that the checker accepts
// every compiled plan over a sweep of worlds.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "step_fixture.hpp"
#include "strategies/tile_signal/defaults.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;
using namespace tilemoe::testing;

namespace {

PlanOptions options(std::int64_t tile_m = 4, std::int64_t tile_n = 16) {
  PlanOptions o;
  o.tile_m = tile_m;
  o.tile_n = tile_n;
  o.combine_tokens = 5;
  return o;
}

}  // namespace

TEST(Plans, CompiledPlansPassTheCheckerOverASweep) {
  std::mt19937_64 rng(12345);
  for (int trial = 0; trial < 60; ++trial) {
    const int world_size = 1 + static_cast<int>(rng() % 8);
    const std::int64_t experts = world_size * (1 + static_cast<std::int64_t>(rng() % 4));
    const std::int64_t k = 1 + static_cast<std::int64_t>(rng() % std::min<std::int64_t>(experts, 8));
    std::vector<std::int64_t> tokens;
    for (int r = 0; r < world_size; ++r) tokens.push_back(static_cast<std::int64_t>(rng() % 40));
    EpWorld world = make_world(tokens, 16, 24, experts, k);
    if (trial % 3 == 0) world.layer.capacity_factor = 1.0;
    const auto pattern = static_cast<RoutingPattern>(trial % 3);
    const StepCase c = make_case(world, pattern, static_cast<std::uint64_t>(trial));
    PlanOptions o = options(1 + static_cast<std::int64_t>(rng() % 6), 8 * (1 + static_cast<std::int64_t>(rng() % 3)));
    o.tile_signal.bands_per_segment = 1 + static_cast<int>(rng() % 2);
    for (Strategy s : {Strategy::Sequential, Strategy::TileSignal, Strategy::Comet}) {
      for (DispatchVolume v : {DispatchVolume::OncePerRank, DispatchVolume::RowPerExpert}) {
        SCOPED_TRACE("trial " + std::to_string(trial) + " " + std::string(strategy_name(s)) + " " + std::string(dispatch_volume_name(v)));
        o.dispatch = v;
        const auto plans = compile_plan(s, world, c.routing, o);
        ASSERT_EQ(plans.size(), static_cast<std::size_t>(world_size));
        EXPECT_NO_THROW(validate_plan(plans));
      }
    }
  }
}

TEST(Plans, TheDispatchSendsEachTokenOnceToEachRankOfItsExperts) {
  // 16 experts on 4 ranks, top-4: a token's experts often share a rank
  EpWorld world = make_world({37, 23, 0, 41}, 32, 40, 16, 4);
  for (const RoutingPattern pattern : {RoutingPattern::Balanced, RoutingPattern::Skewed}) {
    for (const double capacity : {0.0, 0.75}) {
      world.layer.capacity_factor = capacity;
      const StepCase c = make_case(world, pattern, 21);
      const int W = world.world_size();
      const std::int64_t local = world.experts_per_rank(), row_bytes = world.layer.hidden * 2;
      // counted from the routing alone: rows a rank puts on its links either way (dropped slots move nothing)
      std::vector<std::int64_t> rows_per_expert(static_cast<std::size_t>(W)), rows_once(static_cast<std::size_t>(W));
      for (int r = 0; r < W; ++r) {
        const Routing& routing = c.routing[static_cast<std::size_t>(r)];
        for (std::int64_t t = 0; t < routing.tokens; ++t) {
          std::set<int> ranks;
          for (std::int64_t j = 0; j < routing.top_k; ++j) {
            const std::size_t s = routing.slot(t, j);
            const int d = static_cast<int>(routing.expert[s] / local);
            if (!routing.kept[s] || d == r) continue;
            ++rows_per_expert[static_cast<std::size_t>(r)];
            ranks.insert(d);
          }
          rows_once[static_cast<std::size_t>(r)] += static_cast<std::int64_t>(ranks.size());
        }
      }
      for (Strategy s : {Strategy::Sequential, Strategy::TileSignal, Strategy::Comet}) {
        SCOPED_TRACE(std::string(strategy_name(s)) + " " + std::string(routing_pattern_name(pattern)) + " capacity " + std::to_string(capacity));
        PlanOptions o = options();
        o.dispatch = DispatchVolume::RowPerExpert;
        const auto per_expert = compile_plan(s, world, c.routing, o);
        o.dispatch = DispatchVolume::OncePerRank;
        const auto once = compile_plan(s, world, c.routing, o);
        ASSERT_NO_THROW(validate_plan(once));
        std::int64_t saved = 0;
        for (int r = 0; r < W; ++r) {
          const StepPlan& p = once[static_cast<std::size_t>(r)];
          EXPECT_EQ(link_traffic(per_expert[static_cast<std::size_t>(r)]).dispatch_bytes, rows_per_expert[static_cast<std::size_t>(r)] * row_bytes);
          EXPECT_EQ(link_traffic(p).dispatch_bytes, rows_once[static_cast<std::size_t>(r)] * row_bytes);
          EXPECT_EQ(link_traffic(p).combine_bytes, link_traffic(per_expert[static_cast<std::size_t>(r)]).combine_bytes);
          saved += rows_per_expert[static_cast<std::size_t>(r)] - rows_once[static_cast<std::size_t>(r)];
          std::int64_t received = 0;
          for (const StepPlan& q : once) {
            for (const Segment& g : q.segments) {
              if (g.dest_rank != r || q.rank == r || g.src != BufferId::Input) continue;  // the dispatch into r
              EXPECT_EQ(g.dst, BufferId::Received) << "rank " << q.rank << " writes rank " << r << "'s ExpertIn";
              received += g.rows;
            }
          }
          EXPECT_EQ(p.received_rows, received) << "rank " << r << "'s Received holds exactly what reaches it";
        }
        EXPECT_GT(saved, 0) << "top-4 over 4 ranks: some tokens have two experts on one rank";
      }
    }
  }
}

TEST(Plans, TileSignalShipsBandsRemoteFirstWithoutPadding) {
  const EpWorld world = make_world({37, 23, 0, 41}, 32, 40, 8, 3);
  const StepCase c = make_case(world, RoutingPattern::Skewed, 3);
  PlanOptions o = options(8, 16);
  o.tile_signal.band_block = 2;
  const auto plans = compile_plan(Strategy::TileSignal, world, c.routing, o);
  const std::int64_t column_tiles = (32 + 15) / 16;
  for (const StepPlan& p : plans) {
    // the rows of the sequential layout: no padding, nothing zeroed
    std::int64_t routed_here = 0;
    for (const StepPlan& owner : plans) {
      for (std::size_t s = 0; s < owner.combine_source_row.size(); ++s) {
        if (c.routing[static_cast<std::size_t>(owner.rank)].expert[s] / 2 == p.rank) ++routed_here;
      }
    }
    EXPECT_EQ(p.expert_rows, routed_here);
    EXPECT_TRUE(p.zero_rows.empty());
    // the owner of each expert row, from the CombineIn rows the segments write at the owners
    std::vector<int> owner_of_row(static_cast<std::size_t>(p.expert_rows), -1);
    std::int64_t rows_sent = 0;
    std::set<std::int64_t> bands_seen;
    std::vector<std::int64_t> band_order;
    for (const TaskRef& ref : p.comm_queue) {
      if (ref.kind != TaskKind::Segment || p.segments[ref.index].dst != BufferId::CombineIn) continue;
      const Segment& s = p.segments[ref.index];
      for (std::int64_t r = s.src_row; r < s.src_row + s.rows; ++r) {
        EXPECT_EQ(owner_of_row[static_cast<std::size_t>(r)], -1) << "row " << r << " shipped twice";
        owner_of_row[static_cast<std::size_t>(r)] = s.dest_rank;
      }
      rows_sent += s.rows;
      // a segment waits for its bands' flags, each counting all the band's column tiles
      EXPECT_GE(s.wait_count, 1u);
      EXPECT_LE(s.wait_count, static_cast<std::uint32_t>(cpu_bands_per_segment(o.tile_signal)));
      for (std::uint32_t w = s.wait_begin; w < s.wait_begin + s.wait_count; ++w) {
        EXPECT_EQ(p.waits[w].expected, static_cast<std::uint32_t>(column_tiles));
        if (bands_seen.insert(p.waits[w].flag).second) band_order.push_back(p.waits[w].flag);
      }
    }
    EXPECT_EQ(rows_sent, routed_here) << "every row leaves rank " << p.rank << " once";
    // GEMM1: the tiles holding rows of other ranks come first, and the bands are shipped in
    // the order their flags first complete in that schedule
    bool seen_local_only = false;
    std::vector<std::int64_t> flag_order;
    std::set<std::int64_t> flags_seen;
    for (const TaskRef& ref : p.compute_queue) {
      if (ref.kind != TaskKind::Gemm || p.tiles[ref.index].layer != 1) continue;
      const GemmTile& t = p.tiles[ref.index];
      EXPECT_LE(t.row_end - t.row_begin, o.tile_m);
      bool remote = false;
      for (std::int64_t r = t.row_begin; r < t.row_end; ++r) remote = remote || owner_of_row[static_cast<std::size_t>(r)] != p.rank;
      if (!remote) seen_local_only = true;
      else EXPECT_FALSE(seen_local_only) << "a tile with remote rows after a local-only one on rank " << p.rank;
      if (flags_seen.insert(t.signal_flag).second) flag_order.push_back(t.signal_flag);
    }
    EXPECT_EQ(band_order, flag_order) << "rank " << p.rank << " ships its bands in the order GEMM1 starts them";
  }
}

TEST(Plans, CometPutsLocalRowsFirstAndWaitsOnlyForItsSources) {
  const EpWorld world = make_world({30, 30, 30}, 16, 16, 3, 2);
  const StepCase c = make_case(world, RoutingPattern::Balanced, 9);
  for (DispatchVolume volume : {DispatchVolume::OncePerRank, DispatchVolume::RowPerExpert}) {
    SCOPED_TRACE(std::string(dispatch_volume_name(volume)));
    PlanOptions o = options(4, 8);
    o.dispatch = volume;
    const auto plans = compile_plan(Strategy::Comet, world, c.routing, o);
    for (const StepPlan& p : plans) {
      // the first GEMM0 tile needs only this rank's own rows: its flags are raised by this rank's
      // dispatch from its Input, not by rows another rank sent
      const TaskRef first = p.compute_queue.front();
      ASSERT_EQ(first.kind, TaskKind::Gemm);
      const GemmTile& t = p.tiles[first.index];
      ASSERT_EQ(t.layer, 0);
      for (std::uint32_t w = t.wait_begin; w < t.wait_begin + t.wait_count; ++w) {
        ASSERT_EQ(p.waits[w].from_rank, p.rank);
        bool own_rows = false;
        for (const Segment& g : p.segments) own_rows |= g.dest_rank == p.rank && g.dest_flag == static_cast<std::int32_t>(p.waits[w].flag) && g.src == BufferId::Input;
        EXPECT_TRUE(own_rows) << "wait " << w;
      }
      // sends: dispatch goes to self first, then p-1, p-2, ...
      std::vector<int> dests;
      for (const TaskRef& ref : p.comm_queue) {
        if (ref.kind == TaskKind::Segment && p.segments[ref.index].src == BufferId::Input &&
            (dests.empty() || dests.back() != p.segments[ref.index].dest_rank)) {
          dests.push_back(p.segments[ref.index].dest_rank);
        }
      }
      ASSERT_EQ(dests.size(), 3u);
      EXPECT_EQ(dests[0], p.rank);
      EXPECT_EQ(dests[1], (p.rank + 2) % 3);
      // GEMM1 runs split by split: column splits never go backwards in the compute queue
      std::int64_t last_col = -1;
      for (const TaskRef& ref : p.compute_queue) {
        if (ref.kind != TaskKind::Gemm || p.tiles[ref.index].layer != 1) continue;
        const std::int64_t split = p.tiles[ref.index].col_begin / 4;  // hidden 16 -> splits of 4 columns
        EXPECT_GE(split, last_col);
        last_col = split;
      }
      // the reductions run on communication workers
      for (const TaskRef& ref : p.compute_queue) EXPECT_NE(ref.kind, TaskKind::Combine);
    }
  }
}

TEST(Plans, SequentialPhasesWaitForTheWholePreviousPhase) {
  const EpWorld world = make_world({10, 12}, 16, 16, 4, 2);
  const StepCase c = make_case(world, RoutingPattern::Balanced, 1);
  const auto plans = compile_plan(Strategy::Sequential, world, c.routing, options());
  for (const StepPlan& p : plans) {
    std::uint32_t gemm0 = 0;
    for (const GemmTile& t : p.tiles) gemm0 += t.layer == 0;
    for (const GemmTile& t : p.tiles) {
      if (t.layer != 1) continue;
      ASSERT_EQ(t.wait_count, 1u);
      EXPECT_EQ(p.waits[t.wait_begin].expected, gemm0);
    }
  }
}

TEST(Plans, PackRoundTripsEveryTable) {
  const EpWorld world = make_world({9, 0, 17}, 16, 24, 6, 3);
  const StepCase c = make_case(world, RoutingPattern::Skewed, 2);
  for (Strategy s : {Strategy::Sequential, Strategy::TileSignal, Strategy::Comet}) {
    const auto plans = compile_plan(s, world, c.routing, options());
    std::vector<StepPlan> unpacked;
    for (const StepPlan& p : plans) {
      const auto blob = pack_plan(p);
      unpacked.push_back(unpack_plan(blob));
      EXPECT_EQ(pack_plan(unpacked.back()), blob);
      EXPECT_EQ(unpacked.back().tiles.size(), p.tiles.size());
      EXPECT_EQ(unpacked.back().combine_weight, p.combine_weight);
    }
    EXPECT_NO_THROW(validate_plan(unpacked));
  }
  auto blob = pack_plan(compile_plan(Strategy::Comet, world, c.routing, options())[0]);
  blob.resize(blob.size() - 16);
  EXPECT_THROW(unpack_plan(blob), Error);
}

TEST(Plans, RejectsBadOptionsAndRouting) {
  const EpWorld world = make_world({4, 4}, 16, 16, 4, 2);
  const StepCase c = make_case(world, RoutingPattern::Balanced, 1);
  PlanOptions o = options();
  o.tile_m = 0;
  EXPECT_THROW(compile_plan(Strategy::Sequential, world, c.routing, o), Error);
  o = options();
  o.tile_signal.bands_per_segment = -1;
  EXPECT_THROW(compile_plan(Strategy::TileSignal, world, c.routing, o), Error);
  // auto is a GPU layer's choice among strategies, not a plan compiler
  EXPECT_THROW(compile_plan(Strategy::Auto, world, c.routing, options()), Error);
  EXPECT_EQ(parse_strategy("auto"), Strategy::Auto);
  EXPECT_EQ(strategy_name(Strategy::Auto), "auto");
  std::vector<Routing> bad = c.routing;
  bad[1].expert[0] = 99;
  EXPECT_THROW(compile_plan(Strategy::Comet, world, bad, options()), Error);
  bad = c.routing;
  bad.pop_back();
  EXPECT_THROW(compile_plan(Strategy::Comet, world, bad, options()), Error);
}
