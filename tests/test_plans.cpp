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
      SCOPED_TRACE("trial " + std::to_string(trial) + " " + std::string(strategy_name(s)));
      const auto plans = compile_plan(s, world, c.routing, o);
      ASSERT_EQ(plans.size(), static_cast<std::size_t>(world_size));
      EXPECT_NO_THROW(validate_plan(plans));
    }
  }
}

TEST(Plans, TileSignalTilesHaveOneOwnerAndRemoteTilesComeFirst) {
  const EpWorld world = make_world({37, 23, 0, 41}, 32, 32, 8, 3);
  const StepCase c = make_case(world, RoutingPattern::Skewed, 3);
  const PlanOptions o = options(8, 16);
  const auto plans = compile_plan(Strategy::TileSignal, world, c.routing, o);
  for (const StepPlan& p : plans) {
    // padding: every owner group is a multiple of tile_m
    for (const LocalExpert& e : p.experts) EXPECT_EQ((e.row_end - e.row_begin) % o.tile_m, 0);
    bool seen_local = false;
    std::map<std::int32_t, int> remote_bands_of_expert;
    for (const TaskRef& ref : p.compute_queue) {
      if (ref.kind != TaskKind::Gemm || p.tiles[ref.index].layer != 1) continue;
      const GemmTile& t = p.tiles[ref.index];
      ASSERT_GE(t.dest_rank, 0);
      ASSERT_EQ(t.row_end - t.row_begin, o.tile_m);
      EXPECT_GT(t.valid_rows, 0);
      EXPECT_LE(t.valid_rows, o.tile_m);
      if (t.dest_rank == p.rank) seen_local = true;
      else EXPECT_FALSE(seen_local) << "a remote tile after a local one on rank " << p.rank;
      if (t.dest_rank != p.rank && t.col_begin == 0) ++remote_bands_of_expert[t.expert];
    }
    // experts with more remote bands first
    std::vector<int> order;
    std::set<std::int32_t> seen;
    for (const TaskRef& ref : p.compute_queue) {
      if (ref.kind != TaskKind::Gemm) continue;
      const GemmTile& t = p.tiles[ref.index];
      if (t.layer == 1 && t.dest_rank != p.rank && seen.insert(t.expert).second) order.push_back(remote_bands_of_expert[t.expert]);
    }
    for (std::size_t i = 1; i < order.size(); ++i) EXPECT_GE(order[i - 1], order[i]);
    // consumer segments: only real rows, the first and the last one band, the others <= mgb bands
    std::vector<const Segment*> sends;
    for (const TaskRef& ref : p.comm_queue) {
      if (ref.kind == TaskKind::Segment && p.segments[ref.index].dst == BufferId::CombineIn) sends.push_back(&p.segments[ref.index]);
    }
    std::int64_t rows_sent = 0;
    for (std::size_t i = 0; i < sends.size(); ++i) {
      const std::int64_t bands = (sends[i]->rows + o.tile_m - 1) / o.tile_m;
      if (i == 0 || i + 1 == sends.size()) {
        EXPECT_EQ(bands, 1) << "segment " << i;
      }
      EXPECT_LE(bands, cpu_bands_per_segment(o.tile_signal));
      rows_sent += sends[i]->rows;
    }
    std::int64_t routed_here = 0;
    for (const StepPlan& owner : plans) {
      for (std::size_t s = 0; s < owner.combine_source_row.size(); ++s) {
        const std::int32_t e = c.routing[static_cast<std::size_t>(owner.rank)].expert[s];
        if (e / 2 == p.rank) ++routed_here;
      }
    }
    EXPECT_EQ(rows_sent, routed_here) << "only real rows leave rank " << p.rank;
  }
}

TEST(Plans, CometPutsLocalRowsFirstAndWaitsOnlyForItsSources) {
  const EpWorld world = make_world({30, 30, 30}, 16, 16, 3, 2);
  const StepCase c = make_case(world, RoutingPattern::Balanced, 9);
  const auto plans = compile_plan(Strategy::Comet, world, c.routing, options(4, 8));
  for (const StepPlan& p : plans) {
    // the first GEMM0 tile needs only this rank's own rows
    const TaskRef first = p.compute_queue.front();
    ASSERT_EQ(first.kind, TaskKind::Gemm);
    const GemmTile& t = p.tiles[first.index];
    ASSERT_EQ(t.layer, 0);
    for (std::uint32_t w = t.wait_begin; w < t.wait_begin + t.wait_count; ++w) EXPECT_EQ(p.waits[w].from_rank, p.rank);
    // sends: dispatch goes to self first, then p-1, p-2, ...
    std::vector<int> dests;
    for (const TaskRef& ref : p.comm_queue) {
      if (ref.kind == TaskKind::Segment && p.segments[ref.index].dst == BufferId::ExpertIn &&
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
