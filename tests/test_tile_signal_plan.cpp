// tile_signal's counts-only compiler (tile_signal_plan.hpp), which the host runs for the CPU
// engine and the GPU every step: its closed-form order is the plain stable partition
// (tile_signal_tables, band_order.hpp), its lanes may run in any order, and every band's pieces
// ship its rows exactly once, each row raising its own arrival flag.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "plan/plan_tables.hpp"
#include "plan/tile_table.hpp"
#include "step_fixture.hpp"
#include "strategies/strategies.hpp"
#include "strategies/tile_signal/band_order.hpp"
#include "strategies/tile_signal/tile_signal_plan.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;
using namespace tilemoe::plan_detail;

namespace {

TileSignalShape shape_of(int rank, std::int64_t hidden, std::int64_t ffn, int tile_m, int tile_n, int band_block, int per) {
  TileSignalShape s;
  s.gemm.rank = rank;
  s.gemm.tokens = 10;
  s.gemm.hidden = hidden;
  s.gemm.ffn_hidden = ffn;
  s.gemm.tile_m = tile_m;
  s.gemm.tile_n[0] = s.gemm.tile_n[1] = tile_n;
  s.gemm.cluster = cuda::PlannedCluster::N2;
  s.gemm.band_block[1] = band_block;
  s.gemm.combine_tokens = 3;
  s.bands_per_segment = per;
  return s;
}

StepPlan compile_rank(const HostStepCounts& c, const TileSignalShape& s, int lane_order_seed = -1) {
  const int world = c.view().world, local = c.view().local_experts;
  HostPlanTables tables(tile_signal_capacity(world, local, c.view().expert_rows(s.gemm.rank), s.gemm.tokens, s.gemm));
  std::vector<int> prefix(static_cast<std::size_t>(tile_signal_prefix_size(local)));
  tile_signal_prefix(c.view(), s.gemm, prefix.data());
  if (lane_order_seed < 0) {
    compile_tile_signal_tables(c.view(), s, prefix.data(), tables.view());
  } else {  // the GPU's way: a lane per thread, in no particular order
    std::vector<int> lanes = {0, 1, 2, 3, 4, 5, 6};
    std::shuffle(lanes.begin(), lanes.end(), std::mt19937(static_cast<unsigned>(lane_order_seed)));
    for (int lane : lanes) compile_tile_signal_tables(c.view(), s, prefix.data(), tables.view(), lane, 7);
  }
  StepPlan plan;
  plan.rank = s.gemm.rank;
  copy_plan_tables(tables.view(), plan);
  return plan;
}

}  // namespace

TEST(TileSignalPlan, IsTheScheduleTheGpuBuilds) {
  std::mt19937 rng(7122026);
  for (int trial = 0; trial < 200; ++trial) {
    const int world = 1 + static_cast<int>(rng() % 4), local = 1 + static_cast<int>(rng() % 5);
    const int experts = world * local;
    std::vector<int> counts(static_cast<std::size_t>(world * experts));
    for (int& n : counts) n = rng() % 4 == 0 ? 0 : static_cast<int>(rng() % 30);
    const HostStepCounts c(counts, world, experts);
    // tiles that rarely divide the rows or the columns (odd column tiles give padding mates)
    const int tile_m = 1 + static_cast<int>(rng() % 9), tile_n = 1 + static_cast<int>(rng() % 9);
    const int band_block = 2 * static_cast<int>(rng() % 4);
    const std::int64_t hidden = 1 + static_cast<std::int64_t>(rng() % 40);
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE("trial " + std::to_string(trial) + " rank " + std::to_string(rank));
      const TileSignalShape shape = shape_of(rank, hidden, 12, tile_m, tile_n, band_block, 1 + static_cast<int>(rng() % 3));
      const StepPlan p = compile_rank(c, shape);
      std::vector<int> row_offset, block_offset;
      for (int e = 0; e <= local; ++e) row_offset.push_back(c.view().expert_row(rank, e));
      for (int e = 0; e < local; ++e) {
        for (int q = 0; q < world; ++q) block_offset.push_back(c.view().block_row(rank, e, q));
      }
      block_offset.push_back(c.view().expert_rows(rank));
      const cuda::TileSignalTables gpu =
          cuda::tile_signal_tables(row_offset, block_offset, world, rank, static_cast<int>(hidden), band_block, tile_m, tile_n);
      const std::uint32_t band_flag = static_cast<std::uint32_t>(world + 1);
      EXPECT_EQ(p.row_arrival_flag, band_flag + gpu.bands.size());
      EXPECT_EQ(p.flag_count, p.row_arrival_flag + p.combine_rows);
      // GEMM1: the GPU's table entry for entry, padding mates included, band flags offset
      const std::uint32_t gemm0 = static_cast<std::uint32_t>(p.tiles.size()) - static_cast<std::uint32_t>(gpu.gemm1.size());
      ASSERT_EQ(p.tiles.size() - gemm0, gpu.gemm1.size());
      for (std::size_t i = 0; i < gpu.gemm1.size(); ++i) {
        const GemmTile& t = p.tiles[gemm0 + i];
        const cuda::GemmTileEntry& e = gpu.gemm1[i];
        SCOPED_TRACE("GEMM1 entry " + std::to_string(i));
        ASSERT_EQ(t.layer, 1);
        ASSERT_EQ(t.expert, e.group);
        ASSERT_EQ(t.row_begin, e.row_begin);
        ASSERT_EQ(t.row_end - t.row_begin, e.rows);
        ASSERT_EQ(t.col_begin, std::int64_t{e.col_tile} * tile_n);
        ASSERT_EQ(t.signal_flag, e.flag < 0 ? kNoFlag : static_cast<std::int32_t>(band_flag) + e.flag);
      }
      // the bands in the GPU's order: the segments' waits, a piece per source rank each
      const std::size_t dispatch = static_cast<std::size_t>(world * local);
      ASSERT_EQ(p.segments.size(), dispatch + gpu.bands.size() * static_cast<std::size_t>(world));
      for (std::size_t b = 0; b < gpu.bands.size(); ++b) {
        const cuda::TileBand& band = gpu.bands[b];
        std::int64_t rows = 0;
        for (int q = 0; q < world; ++q) {
          const Segment& s = p.segments[dispatch + b * static_cast<std::size_t>(world) + static_cast<std::size_t>(q)];
          ASSERT_EQ(s.dest_rank, q);
          ASSERT_GE(s.src_row, band.row_begin);
          ASSERT_LE(s.src_row + s.rows, band.row_begin + band.rows);
          rows += s.rows;
          bool waits_for_band = false;
          for (std::uint32_t w = s.wait_begin; w < s.wait_begin + s.wait_count; ++w) {
            waits_for_band = waits_for_band || p.waits[w].flag == band_flag + static_cast<std::uint32_t>(band.id);
          }
          ASSERT_TRUE(waits_for_band) << "band " << b << " piece " << q;
        }
        ASSERT_EQ(rows, band.rows) << "band " << b << " ships all its rows";
      }
    }
  }
}

TEST(TileSignalPlan, LanesInAnyOrderWriteTheOnePlan) {
  const EpWorld w = tilemoe::testing::make_world({40, 23, 31}, 16, 40, 6, 2);
  const auto step = tilemoe::testing::make_case(w, RoutingPattern::Skewed, 5);
  const HostStepCounts c = routing_counts(step.routing, 6);
  for (int rank = 0; rank < 3; ++rank) {
    const TileSignalShape shape = shape_of(rank, 24, 40, 3, 8, 2, 2);
    const StepPlan one = compile_rank(c, shape), lanes = compile_rank(c, shape, rank);
    EXPECT_GT(one.tiles.size(), 7u);
    EXPECT_EQ(first_table_difference(one, lanes), "") << "rank " << rank;
  }
}

TEST(TileSignalPlan, CombinesWaitForTheirOwnRowsOnly) {
  // a token chunk's combine waits for the arrival flags of the rows it reads, each raised by one
  // row of one piece; validate_plan proves it (and refuses a plan whose row flag is raised twice)
  const EpWorld w = tilemoe::testing::make_world({30, 17, 25, 9}, 16, 24, 8, 2);
  const auto step = tilemoe::testing::make_case(w, RoutingPattern::Balanced, 11);
  PlanOptions o;
  o.tile_m = 4;
  o.tile_n = 8;
  std::vector<StepPlan> plans = compile_plan(Strategy::TileSignal, w, step.routing, o);
  ASSERT_NO_THROW(validate_plan(plans));
  for (const StepPlan& p : plans) {
    for (const CombineTask& task : p.combines) {
      EXPECT_EQ(task.waits_for_rows, 1);
      EXPECT_EQ(task.wait_count, 0u);
    }
  }
  // a piece that raises the arrival flags of other rows than its own
  {
    std::vector<StepPlan> shifted = plans;
    for (Segment& s : shifted[2].segments) {
      if (s.dst == BufferId::CombineIn && s.rows >= 1) {
        s.dest_flag += 1;
        break;
      }
    }
    try {
      validate_plan(shifted);
      FAIL() << "a piece raising another row's arrival flag was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not their arrival flags"), std::string::npos) << e.what();
    }
  }
  // a piece that raises its first row's flag twice (its second row's flag never)
  for (Segment& s : plans[1].segments) {
    if (s.dst == BufferId::CombineIn && s.rows >= 2) {
      s.flag_per_row = 0;
      break;
    }
  }
  try {
    validate_plan(plans);
    FAIL() << "a row whose arrival flag no segment raises was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("to land"), std::string::npos) << e.what();
  }
}
