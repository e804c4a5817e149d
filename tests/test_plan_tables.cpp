// The fixed-room plan tables and the compiler that fills them from counts alone (the sequential
// strategy's, which the GPU runs too): room that always suffices, overflow caught and named, the
// per-token tables in the permuted order, and the table comparison the GPU tests rely on.
#include <gtest/gtest.h>

#include <random>

#include "plan/plan_tables.hpp"
#include "step_fixture.hpp"
#include "plan/tile_table.hpp"
#include "strategies/sequential/sequential_plan.hpp"
#include "strategies/strategies.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;
using namespace tilemoe::plan_detail;

namespace {

SequentialShape shape_of(int rank, std::int64_t tokens, std::int64_t hidden, std::int64_t ffn, std::int64_t tile_m,
                         std::int64_t tile_n, cuda::PlannedCluster cluster = cuda::PlannedCluster::None) {
  SequentialShape s;
  s.rank = rank;
  s.tokens = tokens;
  s.hidden = hidden;
  s.ffn_hidden = ffn;
  s.tile_m = tile_m;
  s.tile_n[0] = s.tile_n[1] = tile_n;
  s.cluster = cluster;
  s.combine_tokens = 5;
  return s;
}

// The host's way: the prefix sums, then the tables (lane `lane` of `lanes`).
void compile_tables(const HostStepCounts& c, const SequentialShape& s, HostPlanTables& tables, int lane = 0, int lanes = 1) {
  std::vector<int> tile_first(static_cast<std::size_t>(sequential_prefix_size(c.view().local_experts)));
  sequential_prefix(c.view(), s, tile_first.data());
  compile_sequential_tables(c.view(), s, tile_first.data(), tables.view(), lane, lanes);
}

constexpr cuda::PlannedCluster kOrders[] = {cuda::PlannedCluster::None, cuda::PlannedCluster::N2, cuda::PlannedCluster::M2};

}  // namespace

TEST(PlanTables, RandomCountsCompileToValidPlansWithinTheirRoom) {
  std::mt19937 rng(20261206);
  for (int trial = 0; trial < 60; ++trial) {
    const int world = 1 + static_cast<int>(rng() % 5), local = 1 + static_cast<int>(rng() % 4);
    const std::int64_t k = 1 + static_cast<std::int64_t>(rng() % std::min<unsigned>(4u, static_cast<unsigned>(world * local)));
    std::vector<std::int64_t> tokens(static_cast<std::size_t>(world));
    for (auto& t : tokens) t = static_cast<std::int64_t>(rng() % 40);  // empty ranks too
    const EpWorld w = tilemoe::testing::make_world(tokens, 16, 24, world * local, k);
    const auto step = tilemoe::testing::make_case(w, trial % 2 ? RoutingPattern::Skewed : RoutingPattern::Balanced, 100 + trial);
    PlanOptions o;
    o.tile_m = 1 + static_cast<std::int64_t>(rng() % 9);
    o.tile_n = 1 + static_cast<std::int64_t>(rng() % 20);
    o.combine_tokens = 1 + static_cast<std::int64_t>(rng() % 8);
    const std::vector<StepPlan> plans = compile_plan(Strategy::Sequential, w, step.routing, o);
    ASSERT_NO_THROW(validate_plan(plans)) << "trial " << trial;
    for (const StepPlan& p : plans) EXPECT_EQ(first_table_difference(p, p), "");
    // the GPU's orders: cluster mates adjacent, padding mates, bands in blocks (even sizes)
    SequentialShape tiling = shape_of(0, 0, 0, 0, o.tile_m, o.tile_n, kOrders[trial % 3]);
    tiling.tile_n[0] = 1 + static_cast<std::int64_t>(rng() % 20);
    tiling.band_block[0] = 2 * static_cast<int>(rng() % 3);
    tiling.band_block[1] = 2 * static_cast<int>(rng() % 3);
    tiling.dispatch = trial % 2 == 0 ? DispatchVolume::OncePerRank : DispatchVolume::RowPerExpert;
    ASSERT_NO_THROW(validate_plan(compile_sequential_at(w, step.routing, o, tiling))) << "trial " << trial;
  }
}

TEST(PlanTables, TheRoomIsTheBoundAndAnOverflowIsNamed) {
  // every expert's rows one past a multiple of the tile (the most bands the bound allows; a
  // 2x1 cluster pads them to pairs), and an odd number of GEMM1 column tiles (padded on 1x2)
  const int world = 2, local = 3, experts = world * local;
  const std::int64_t tile_m = 4, tile_n = 8, hidden = 20, ffn = 12;
  std::vector<int> counts(static_cast<std::size_t>(world * experts));
  for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = static_cast<int>(i % 2 == 0 ? 5 : 0);  // 5 = 4 + 1
  const HostStepCounts c(counts, world, experts);
  for (const cuda::PlannedCluster order : kOrders) {
    SCOPED_TRACE("order " + std::to_string(static_cast<int>(order)));
    const SequentialShape shape = shape_of(0, 17, hidden, ffn, tile_m, tile_n, order);
    const PlanCapacity room = sequential_capacity(world, local, c.view().expert_rows(0), shape.tokens, shape);
    HostPlanTables fits(room);
    compile_tables(c, shape, fits);
    EXPECT_EQ(fits.view().header.overflow, 0u);
    StepPlan plan;
    ASSERT_NO_THROW(copy_plan_tables(fits.view(), plan));
    EXPECT_FALSE(plan.tiles.empty());

    PlanCapacity short_of_tiles = room;
    short_of_tiles.entries[kTilesTable] = static_cast<std::uint32_t>(plan.tiles.size() - 1);
    HostPlanTables cramped(short_of_tiles);
    compile_tables(c, shape, cramped);
    EXPECT_EQ(cramped.view().header.overflow, static_cast<std::uint32_t>(kTilesTable + 1));
    try {
      StepPlan lost;
      copy_plan_tables(cramped.view(), lost);
      FAIL() << "an overflowed plan was copied";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Internal);
      EXPECT_NE(std::string(e.what()).find("tiles"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(checked_capacity({1, 1, std::int64_t{1} << 32, 1, 1, 1, 1}), Error);

  // counts past the buffers' room (a failing exchange's), with the room sized for the rows the
  // layer holds as on the GPU: no tiles at all, and the plan says why (not "too small a room")
  std::vector<int> many(counts.size());
  for (std::size_t i = 0; i < many.size(); ++i) many[i] = 8 * counts[i];  // far more bands than a small room has
  const HostStepCounts flood(many, world, experts);
  SequentialShape bounded = shape_of(0, 17, hidden, ffn, tile_m, tile_n, cuda::PlannedCluster::N2);
  for (const std::int64_t held : {std::int64_t{flood.view().expert_rows(0) - 1}, std::int64_t{1}}) {
    bounded.receive_rows = held;
    HostPlanTables past(sequential_capacity(world, local, held, bounded.tokens, bounded));
    compile_tables(flood, bounded, past);
    EXPECT_EQ(past.view().header.rows_exceed_room, 1u) << held << " rows held";
    EXPECT_EQ(past.view().header.overflow, 0u) << held << " rows held";
    EXPECT_EQ(past.view().tiles.count, 0u);
    StepPlan refused;
    try {
      copy_plan_tables(past.view(), refused);
      ADD_FAILURE() << "a plan of too many rows was copied";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("receive room"), std::string::npos) << e.what();
    }
  }
  bounded.receive_rows = c.view().expert_rows(0);
  HostPlanTables exact(sequential_capacity(world, local, c.view().expert_rows(0), bounded.tokens, bounded));
  compile_tables(c, bounded, exact);
  EXPECT_EQ(exact.view().header.rows_exceed_room, 0u);
  EXPECT_GT(exact.view().tiles.count, 0u);
}

TEST(PlanTables, TheGpuShapedTilesAreThePlannedGemmsTable) {
  // The GPU's GEMMs walk the plan's tiles: at the GPU's tiling they must be, entry for entry, the
  // sequential table that build_tile_table decodes from the local experts' row offsets (the table
  // the planned GEMM ran before it read plans), padding mates included. GEMM0's tiles are half
  // as wide in output columns as in GEMM columns (SwiGLU's gate/up pairs).
  std::mt19937 rng(6122026);
  for (int trial = 0; trial < 40; ++trial) {
    const int world = 1 + static_cast<int>(rng() % 4), local = 1 + static_cast<int>(rng() % 5);
    const int experts = world * local;
    std::vector<int> counts(static_cast<std::size_t>(world * experts));
    for (int& n : counts) n = rng() % 4 == 0 ? 0 : static_cast<int>(rng() % 30);
    const HostStepCounts c(counts, world, experts);
    const int gemm_tile_n = 8, tile_m = 4;
    SequentialShape shape = shape_of(0, 10, 8 * (1 + static_cast<std::int64_t>(rng() % 5)), 4 * (1 + static_cast<std::int64_t>(rng() % 9)),
                                     tile_m, gemm_tile_n, trial % 2 ? cuda::PlannedCluster::N2 : cuda::PlannedCluster::M2);
    shape.tile_n[0] = gemm_tile_n / 2;
    shape.band_block[0] = 2 * static_cast<int>(rng() % 3);
    for (int rank = 0; rank < world; ++rank) {
      shape.rank = rank;
      HostPlanTables tables(sequential_capacity(world, local, c.view().expert_rows(rank), shape.tokens, shape));
      compile_tables(c, shape, tables);
      StepPlan plan;
      copy_plan_tables(tables.view(), plan);
      std::vector<int> row_offset;
      for (int e = 0; e <= local; ++e) row_offset.push_back(c.view().expert_row(rank, e));
      std::size_t at = 0;
      for (int layer = 0; layer < 2; ++layer) {
        const std::int64_t gemm_cols = layer == 0 ? 2 * shape.ffn_hidden : shape.hidden;
        const std::vector<cuda::GemmTileEntry> table =
            cuda::build_tile_table(row_offset, static_cast<int>(gemm_cols), shape.cluster, cuda::TileFlags::None,
                                   shape.band_block[layer], tile_m, gemm_tile_n);
        ASSERT_EQ(tables.view().header.layer_tiles[layer], table.size()) << "trial " << trial << " rank " << rank << " layer " << layer;
        for (std::size_t i = 0; i < table.size(); ++i, ++at) {
          const GemmTile& t = plan.tiles[at];
          const cuda::GemmTileEntry& e = table[i];
          SCOPED_TRACE("trial " + std::to_string(trial) + " rank " + std::to_string(rank) + " layer " + std::to_string(layer) +
                       " entry " + std::to_string(i));
          ASSERT_EQ(t.layer, layer);
          ASSERT_EQ(t.expert, e.group);
          ASSERT_EQ(t.row_begin, e.row_begin);
          ASSERT_EQ(t.row_end - t.row_begin, e.rows);
          ASSERT_EQ(t.col_begin, e.col_tile * shape.tile_n[layer]);
          ASSERT_EQ(t.signal_flag, e.rows > 0 ? world + layer : kNoFlag);
        }
      }
      EXPECT_EQ(at, plan.tiles.size());
    }
  }
}

TEST(PlanTables, TokenTablesFollowThePermutedOrder) {
  const EpWorld w = tilemoe::testing::make_world({30, 11, 0}, 16, 24, 6, 3);
  const auto step = tilemoe::testing::make_case(w, RoutingPattern::Skewed, 7);
  const std::vector<StepPlan> plans = compile_plan(Strategy::Sequential, w, step.routing, PlanOptions{});
  const HostStepCounts c = routing_counts(step.routing, 6);
  for (int r = 0; r < 3; ++r) {
    const StepPlan& p = plans[static_cast<std::size_t>(r)];
    const Routing& routing = step.routing[static_cast<std::size_t>(r)];
    for (int x = 0; x < 6; ++x) {
      for (int row = c.view().offset_of(r, x) + 1; row < c.view().offset_of(r, x + 1); ++row) {
        EXPECT_LT(p.gather_rows[static_cast<std::size_t>(row - 1)], p.gather_rows[static_cast<std::size_t>(row)]) << "tokens ascending";
      }
    }
    for (std::size_t s = 0; s < routing.expert.size(); ++s) {
      const std::int64_t row = p.combine_source_row[s];
      if (!routing.kept[s]) {
        EXPECT_EQ(row, -1);
        continue;
      }
      EXPECT_EQ(p.gather_rows[static_cast<std::size_t>(row)], static_cast<std::int64_t>(s) / routing.top_k);
      EXPECT_GE(row, c.view().offset_of(r, routing.expert[s]));
      EXPECT_LT(row, c.view().offset_of(r, routing.expert[s] + 1));
    }
  }
}

TEST(PlanTables, TheFirstDifferenceIsNamed) {
  const EpWorld w = tilemoe::testing::make_world({9, 9}, 16, 24, 4, 2);
  const auto step = tilemoe::testing::make_case(w, RoutingPattern::Balanced, 3);
  std::vector<StepPlan> plans = compile_plan(Strategy::Sequential, w, step.routing, PlanOptions{});
  StepPlan changed = plans[1];
  ASSERT_GE(changed.tiles.size(), 3u);
  changed.tiles[2].row_end -= 1;
  EXPECT_EQ(first_table_difference(plans[1], changed), "tiles[2]: row_end " + std::to_string(plans[1].tiles[2].row_end) + " / " +
                                                           std::to_string(changed.tiles[2].row_end));
  changed = plans[1];
  changed.comm_queue.pop_back();
  EXPECT_NE(first_table_difference(plans[1], changed).find("comm queue"), std::string::npos);
  EXPECT_NE(first_table_difference(plans[0], plans[1]), "") << "two ranks' plans differ";
}

TEST(PlanTables, LanesInAnyOrderWriteTheOnePlan) {
  // the GPU's CTA runs the compiler a lane per thread, in no particular order: lanes run one after
  // the other in a shuffled order here must give the plan of one lane
  const EpWorld w = tilemoe::testing::make_world({40, 23, 31}, 16, 40, 6, 2);
  const auto step = tilemoe::testing::make_case(w, RoutingPattern::Skewed, 5);
  const HostStepCounts c = routing_counts(step.routing, 6);
  for (int trial = 0; trial < 6; ++trial) {  // each rank, with either dispatch
    const int rank = trial % 3;
    SequentialShape shape = shape_of(rank, 40, 16, 40, 3, 7);
    shape.dispatch = trial < 3 ? DispatchVolume::RowPerExpert : DispatchVolume::OncePerRank;
    const PlanCapacity room = sequential_capacity(3, 2, c.view().expert_rows(rank), shape.tokens, shape);
    HostPlanTables one(room), lanes(room);
    compile_tables(c, shape, one);
    for (int lane : {3, 1, 4, 0, 2}) compile_tables(c, shape, lanes, lane, 5);
    StepPlan a, b;
    a.rank = b.rank = rank;
    copy_plan_tables(one.view(), a);
    copy_plan_tables(lanes.view(), b);
    EXPECT_GT(a.tiles.size(), 5u);
    EXPECT_EQ(first_table_difference(a, b), "") << "rank " << rank << " " << dispatch_volume_name(shape.dispatch);
  }
}

// What the GPU's exchange (exec/cuda/segment_copy.hpp, send_lists.hpp) assumes of both
// compilers' plans, with either dispatch volume: the dispatch is segments
// [0, dispatch_segment_count) (and sequential's combine send the next W L), each raising a
// counted flag below 3 W + 2 (2 W + 2 a row per expert). A row per expert: each reads
// contiguous rows of the permuted order (the gather table's first part). Once per rank: Input
// rows gathered (own rows and send lists) and Received rows gathered through the placement
// entries, within the room the layer's region gives the gather table and Received; a wait for
// another rank names a flag that rank's segments raise here. Waits for this rank are met by
// stream order; every GEMM0 tile waits as the first one does, and every sequential combine task
// as the first one does, for flags that the segments raise.
TEST(PlanTables, TheExchangeRunsEitherPlansSegments) {
  std::mt19937 rng(20261207);
  for (int trial = 0; trial < 40; ++trial) {
    const int world = 1 + static_cast<int>(rng() % 5), local = 1 + static_cast<int>(rng() % 4);
    const std::int64_t k = 1 + static_cast<std::int64_t>(rng() % std::min<unsigned>(4u, static_cast<unsigned>(world * local)));
    std::vector<std::int64_t> tokens(static_cast<std::size_t>(world));
    for (auto& t : tokens) t = static_cast<std::int64_t>(rng() % 40);
    const EpWorld w = tilemoe::testing::make_world(tokens, 16, 24, world * local, k);
    const auto step = tilemoe::testing::make_case(w, trial % 2 ? RoutingPattern::Skewed : RoutingPattern::Balanced, 300 + trial);
    PlanOptions o;
    o.tile_m = 1 + static_cast<std::int64_t>(rng() % 9);
    o.tile_n = 8;
    o.dispatch = trial % 4 < 2 ? DispatchVolume::RowPerExpert : DispatchVolume::OncePerRank;
    const bool once = o.dispatch == DispatchVolume::OncePerRank;
    const std::int64_t most_tokens = *std::max_element(tokens.begin(), tokens.end());
    for (const Strategy strategy : {Strategy::Sequential, Strategy::TileSignal}) {
      const std::vector<StepPlan> plans = compile_plan(strategy, w, step.routing, o);
      for (const StepPlan& p : plans) {
        SCOPED_TRACE("trial " + std::to_string(trial) + " " + std::string(strategy_name(strategy)) + " " +
                     std::string(dispatch_volume_name(o.dispatch)) + " rank " + std::to_string(p.rank));
        const int W = world, L = local, dispatch = dispatch_segment_count(W, L, o.dispatch);
        const int exchanged = strategy == Strategy::Sequential ? dispatch + W * L : dispatch;
        const int flag_room = once ? 3 * W + 2 : 2 * W + 2;
        // the room the layer's region gives (ep_region_layout, for steps of at most most_tokens a rank)
        ASSERT_LE(static_cast<std::int64_t>(p.gather_rows.size()),
                  most_tokens * k + most_tokens * std::min<std::int64_t>(k, W - 1) + p.expert_rows);
        ASSERT_LE(p.received_rows, std::min<std::int64_t>((W - 1) * most_tokens, W * most_tokens * std::min<std::int64_t>(k, L)));
        ASSERT_GE(static_cast<int>(p.segments.size()), exchanged);
        for (int j = 0; j < exchanged; ++j) {
          const Segment& s = p.segments[static_cast<std::size_t>(j)];
          const bool out = j < dispatch;
          if (out) {
            ASSERT_TRUE(s.src == BufferId::Input || (once && s.src == BufferId::Received)) << "segment " << j;
            ASSERT_TRUE(s.dst == BufferId::ExpertIn || (once && s.dst == BufferId::Received)) << "segment " << j;
            // every dispatch row is gathered: from the permuted copy (a row per expert: gather_rows
            // starts with the permuted order, TokenTablesFollowThePermutedOrder) or through the table
            ASSERT_EQ(s.gather_count, static_cast<std::uint32_t>(s.rows)) << "segment " << j;
            ASSERT_LE(s.gather_begin + static_cast<std::size_t>(s.rows), p.gather_rows.size()) << "segment " << j;
            if (!once) {
              ASSERT_LE(s.gather_begin + s.rows, p.combine_rows) << "segment " << j;
            }
          } else {
            ASSERT_EQ(s.src, BufferId::ExpertOut) << "segment " << j;
            ASSERT_EQ(s.dst, BufferId::CombineIn) << "segment " << j;
          }
          ASSERT_EQ(s.flag_per_row, 0);
          ASSERT_TRUE(s.dest_flag >= 0 && s.dest_flag < flag_room) << "segment " << j;
          ASSERT_EQ(s.col_begin, 0);
          ASSERT_EQ(s.col_end, p.hidden);
          for (std::uint32_t i = 0; i < s.wait_count; ++i) {
            const FlagWait& fw = p.waits[s.wait_begin + i];
            if (fw.from_rank == p.rank) continue;
            // another rank's flag: raised here by that rank's segments, fw.expected of them
            ASSERT_TRUE(once && s.src == BufferId::Received) << "segment " << j << " waits for rank " << fw.from_rank;
            const StepPlan& source = plans[static_cast<std::size_t>(fw.from_rank)];
            std::uint32_t raising = 0;
            for (int sj = 0; sj < dispatch; ++sj) {
              const Segment& t = source.segments[static_cast<std::size_t>(sj)];
              raising += t.dest_rank == p.rank && t.dest_flag == static_cast<std::int32_t>(fw.flag) ? 1u : 0u;
            }
            ASSERT_EQ(raising, fw.expected) << "segment " << j;
          }
        }
        auto same_waits = [&](std::uint32_t begin, std::uint32_t count, std::uint32_t begin0, std::uint32_t count0) {
          return begin == begin0 && count == count0;
        };
        auto raised_by_segments = [&](std::uint32_t begin, std::uint32_t count) {
          for (std::uint32_t i = 0; i < count; ++i) {
            if (p.waits[begin + i].flag >= static_cast<std::uint32_t>(flag_room)) return false;
          }
          return true;
        };
        for (const GemmTile& t : p.tiles) {
          if (t.layer == 0) {
            ASSERT_TRUE(same_waits(t.wait_begin, t.wait_count, p.tiles[0].wait_begin, p.tiles[0].wait_count));
          }
        }
        if (!p.tiles.empty()) {
          ASSERT_TRUE(raised_by_segments(p.tiles[0].wait_begin, p.tiles[0].wait_count));
        }
        if (strategy == Strategy::Sequential && !p.combines.empty()) {
          for (const CombineTask& c : p.combines) {
            ASSERT_TRUE(same_waits(c.wait_begin, c.wait_count, p.combines[0].wait_begin, p.combines[0].wait_count));
          }
          ASSERT_TRUE(raised_by_segments(p.combines[0].wait_begin, p.combines[0].wait_count));
        }
      }
    }
  }
}
