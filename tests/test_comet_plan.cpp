// COMET's counts-only compiler (comet_plan.hpp), which the host runs for the CPU engine and the GPU
// runs every step: its lanes may run in any order, GEMM0's bands come in the ring order of
// their last source and wait for exactly the sources of their rows, GEMM1 runs split after split,
// and every plan passes the checker with either dispatch.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <tuple>

#include "plan/plan_tables.hpp"
#include "step_fixture.hpp"
#include "strategies/comet/comet_plan.hpp"
#include "strategies/strategies.hpp"

using namespace tilemoe;
using namespace tilemoe::plan_detail;

namespace {

CometShape shape_of(int rank, std::int64_t tokens, std::int64_t hidden, std::int64_t ffn, int tile_m, int tile_n, std::int64_t split,
                    DispatchVolume dispatch) {
  CometShape s;
  s.gemm.rank = rank;
  s.gemm.tokens = tokens;
  s.gemm.hidden = hidden;
  s.gemm.ffn_hidden = ffn;
  s.gemm.tile_m = tile_m;
  s.gemm.tile_n[0] = s.gemm.tile_n[1] = tile_n;
  s.gemm.combine_tokens = 3;
  s.gemm.dispatch = dispatch;
  s.split_cols = split;
  return s;
}

// One rank's plan, its lanes in the order given (empty: one lane).
StepPlan compile_rank(const HostStepCounts& c, const CometShape& s, const std::vector<int>& lanes = {}) {
  const int world = c.view().world, local = c.view().local_experts;
  HostPlanTables tables(comet_capacity(world, local, c.view().expert_rows(s.gemm.rank), s.gemm.tokens, s));
  std::vector<int> prefix(static_cast<std::size_t>(comet_prefix_size(world, local, comet_splits(s))));
  comet_prefix(c.view(), s, prefix.data());
  if (lanes.empty()) {
    compile_comet_tables(c.view(), s, prefix.data(), tables.view());
  } else {
    for (int lane : lanes) compile_comet_tables(c.view(), s, prefix.data(), tables.view(), lane, static_cast<int>(lanes.size()));
  }
  StepPlan plan;
  plan.rank = s.gemm.rank;
  copy_plan_tables(tables.view(), plan);
  return plan;
}

}  // namespace

TEST(CometPlan, LanesInAnyOrderWriteTheOnePlanAndBandsWaitForTheirSources) {
  std::mt19937 rng(20261207);
  for (int trial = 0; trial < 120; ++trial) {
    const int world = 1 + static_cast<int>(rng() % 5), local = 1 + static_cast<int>(rng() % 4), experts = world * local;
    std::vector<int> counts(static_cast<std::size_t>(world * experts));
    for (int& n : counts) n = rng() % 4 == 0 ? 0 : static_cast<int>(rng() % 23);
    std::vector<int> rank_tokens(static_cast<std::size_t>(world * world));
    for (int q = 0; q < world; ++q) {
      for (int d = 0; d < world; ++d) {  // at most the rows q sends d, at least the most of one of d's experts
        int rows = 0, most = 0;
        for (int e = 0; e < local; ++e) {
          rows += counts[static_cast<std::size_t>(q * experts + d * local + e)];
          most = std::max(most, counts[static_cast<std::size_t>(q * experts + d * local + e)]);
        }
        rank_tokens[static_cast<std::size_t>(q * world + d)] = q == d ? 0 : most + static_cast<int>(rng() % static_cast<unsigned>(rows - most + 1));
      }
    }
    const HostStepCounts c(counts, world, experts, rank_tokens);
    const int tile_m = 1 + static_cast<int>(rng() % 9), tile_n = 1 + static_cast<int>(rng() % 9);
    const std::int64_t hidden = 1 + static_cast<std::int64_t>(rng() % 40), split = 1 + static_cast<std::int64_t>(rng() % 20);
    const DispatchVolume dispatch = trial % 2 == 0 ? DispatchVolume::OncePerRank : DispatchVolume::RowPerExpert;
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE("trial " + std::to_string(trial) + " rank " + std::to_string(rank));
      const CometShape s = shape_of(rank, 1 + static_cast<std::int64_t>(rng() % 20), hidden, 12, tile_m, tile_n, split, dispatch);
      const StepPlan p = compile_rank(c, s);
      std::vector<int> lanes = {0, 1, 2, 3, 4, 5, 6};
      std::shuffle(lanes.begin(), lanes.end(), rng);
      ASSERT_EQ(first_table_difference(p, compile_rank(c, s, lanes)), "");
      // GEMM0: the waves of the bands' last ring positions never go backwards, inside a wave the
      // experts neither, and an expert's bands there go column tile after column tile; each tile
      // waits for exactly the ring positions its rows come from
      const auto wave_of = [&](int position) {
        int k = 0;
        while (comet_wave_begin(world, k + 1) <= position) ++k;
        return k;
      };
      int last_wave = 0, last_expert = 0;
      std::int64_t last_col = 0;
      std::set<std::pair<std::int64_t, std::int64_t>> bands;
      for (const GemmTile& t : p.tiles) {
        if (t.layer != 0) continue;
        bands.insert({t.row_begin, t.row_end});
        std::set<int> sources;
        for (std::int64_t row = t.row_begin; row < t.row_end; ++row) {
          for (int q = 0; q < world; ++q) {
            const int begin = c.view().ring_block_row(rank, t.expert, q);
            if (row >= begin && row < begin + c.view().count(q, rank * local + t.expert)) sources.insert((q - rank + world) % world);
          }
        }
        ASSERT_FALSE(sources.empty());
        EXPECT_EQ(t.wait_begin, static_cast<std::uint32_t>(*sources.begin()));
        EXPECT_EQ(t.wait_begin + t.wait_count - 1, static_cast<std::uint32_t>(*sources.rbegin()));
        const int wave = wave_of(*sources.rbegin());
        EXPECT_GE(wave, last_wave);
        if (wave == last_wave) {
          EXPECT_GE(t.expert, last_expert);
          if (t.expert == last_expert) {
            EXPECT_GE(t.col_begin, last_col);
          }
        }
        last_wave = wave;
        last_expert = t.expert;
        last_col = t.col_begin;
      }
      std::int64_t covered = 0;
      for (const auto& [begin, end] : bands) covered += end - begin;
      EXPECT_EQ(covered, c.view().expert_rows(rank)) << "the bands cover every row once";
      // GEMM1: split after split
      std::int64_t last_split = 0;
      for (const GemmTile& t : p.tiles) {
        if (t.layer != 1) continue;
        EXPECT_GE(t.col_begin / split, last_split);
        EXPECT_EQ(t.col_begin / split, (t.col_end - 1) / split) << "a tile stays inside its split";
        last_split = t.col_begin / split;
      }
    }
  }
}

TEST(CometPlan, PlansFromARoutingPassTheChecker) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int world = 1 + static_cast<int>(rng() % 6);
    const std::int64_t experts = world * (1 + static_cast<std::int64_t>(rng() % 3));
    const std::int64_t k = 1 + static_cast<std::int64_t>(rng() % std::min<std::int64_t>(experts, 6));
    std::vector<std::int64_t> tokens(static_cast<std::size_t>(world));
    for (auto& t : tokens) t = static_cast<std::int64_t>(rng() % 30);
    const EpWorld w = tilemoe::testing::make_world(tokens, 8 * (1 + static_cast<std::int64_t>(rng() % 4)), 16, experts, k);
    const auto step = tilemoe::testing::make_case(w, static_cast<RoutingPattern>(trial % 3), 40 + static_cast<std::uint64_t>(trial));
    PlanOptions o;
    o.tile_m = 1 + static_cast<std::int64_t>(rng() % 6);
    o.tile_n = 8;
    o.comet.split_cols = std::min<std::int64_t>(w.layer.hidden, 8 * static_cast<std::int64_t>(rng() % 3));  // 0: a quarter of hidden
    o.dispatch = trial % 2 == 0 ? DispatchVolume::OncePerRank : DispatchVolume::RowPerExpert;
    ASSERT_NO_THROW(validate_plan(compile_plan(Strategy::Comet, w, step.routing, o))) << "trial " << trial;
  }
}

// The GPU's order (1x2 pairs of column tiles): mates adjacent, sharing their band and waits (a
// padding mate loads part of the rows its partner computes on), padding only where a band's
// tiles of a GEMM (of a split) are odd; the real tiles are the unpaired plan's; every wait for a
// GEMM's flag expects exactly the real tiles that raise it; and the plans pass the checker.
TEST(CometPlan, TheGpusPairsKeepMatesTogetherAndCountRealTiles) {
  std::mt19937 rng(1207);
  for (int trial = 0; trial < 40; ++trial) {
    const int world = 1 + static_cast<int>(rng() % 5);
    const std::int64_t experts = world * (1 + static_cast<std::int64_t>(rng() % 3));
    const std::int64_t k = 1 + static_cast<std::int64_t>(rng() % std::min<std::int64_t>(experts, 5));
    std::vector<std::int64_t> tokens(static_cast<std::size_t>(world));
    for (auto& t : tokens) t = static_cast<std::int64_t>(rng() % 30);
    const std::int64_t tile_n = 8;
    const EpWorld w = tilemoe::testing::make_world(tokens, tile_n * (1 + static_cast<std::int64_t>(rng() % 7)),
                                                   tile_n * (1 + static_cast<std::int64_t>(rng() % 5)), experts, k);
    const auto step = tilemoe::testing::make_case(w, static_cast<RoutingPattern>(trial % 3), 90 + static_cast<std::uint64_t>(trial));
    CometShape paired;
    paired.gemm.tile_m = 1 + static_cast<std::int64_t>(rng() % 6);
    paired.gemm.tile_n[0] = paired.gemm.tile_n[1] = tile_n;
    paired.gemm.combine_tokens = 5;
    paired.gemm.dispatch = trial % 2 == 0 ? DispatchVolume::OncePerRank : DispatchVolume::RowPerExpert;
    paired.gemm.cluster = cuda::PlannedCluster::N2;
    paired.split_cols = tile_n * (1 + static_cast<std::int64_t>(rng() % 3));
    CometShape unpaired = paired;
    unpaired.gemm.cluster = cuda::PlannedCluster::None;
    const std::vector<StepPlan> plans = compile_comet_at(w, step.routing, PlanOptions{}, paired);
    const std::vector<StepPlan> singles = compile_comet_at(w, step.routing, PlanOptions{}, unpaired);
    ASSERT_NO_THROW(validate_plan(plans)) << "trial " << trial;
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE("trial " + std::to_string(trial) + " rank " + std::to_string(rank));
      const StepPlan& p = plans[static_cast<std::size_t>(rank)];
      ASSERT_EQ(p.tiles.size() % 2, 0u);
      using Key = std::tuple<int, int, std::int64_t, std::int64_t, std::int64_t>;
      std::multiset<Key> real, single;
      for (std::size_t i = 0; i < p.tiles.size(); i += 2) {
        const GemmTile& a = p.tiles[i];
        const GemmTile& b = p.tiles[i + 1];
        EXPECT_EQ(a.layer, b.layer);
        EXPECT_EQ(a.expert, b.expert);
        EXPECT_EQ(a.row_begin, b.row_begin);
        EXPECT_EQ(a.wait_begin, b.wait_begin);
        EXPECT_EQ(a.wait_count, b.wait_count);
        ASSERT_GT(a.row_end, a.row_begin) << "the first mate computes";
        if (b.row_end == b.row_begin) {  // padding: its partner's copy, raising nothing
          EXPECT_EQ(b.col_begin, a.col_begin);
          EXPECT_EQ(b.signal_flag, kNoFlag);
        } else {
          EXPECT_EQ(b.col_begin, a.col_begin + tile_n);
        }
        for (const GemmTile* t : {&a, &b}) {
          if (t->row_end > t->row_begin) real.insert({t->layer, t->expert, t->row_begin, t->row_end, t->col_begin});
        }
      }
      for (const GemmTile& t : singles[static_cast<std::size_t>(rank)].tiles) single.insert({t.layer, t.expert, t.row_begin, t.row_end, t.col_begin});
      EXPECT_TRUE(real == single) << "the paired plan computes the unpaired plan's tiles";
      CometShape at_rank = paired;
      at_rank.gemm.hidden = w.layer.hidden;
      for (const FlagWait& fw : p.waits) {
        if (fw.flag < comet_segment_flags(world, comet_splits(at_rank))) continue;  // a segment's flag
        const auto raising = std::count_if(p.tiles.begin(), p.tiles.end(), [&](const GemmTile& t) { return t.signal_flag == static_cast<std::int32_t>(fw.flag); });
        EXPECT_EQ(static_cast<std::int64_t>(fw.expected), raising) << "flag " << fw.flag;
      }
    }
  }
}

// GEMM0's waves: ring positions [0, 1), [1, 4), [4, 16), [16, 64), clipped to the world, then empty.
TEST(CometPlan, WavesGrowFourfold) {
  const std::vector<int> at_64 = {0, 1, 4, 16, 64, 64};
  for (int k = 0; k < static_cast<int>(at_64.size()); ++k) EXPECT_EQ(comet_wave_begin(64, k), at_64[static_cast<std::size_t>(k)]) << k;
  const std::vector<int> at_8 = {0, 1, 4, 8, 8};
  for (int k = 0; k < static_cast<int>(at_8.size()); ++k) EXPECT_EQ(comet_wave_begin(8, k), at_8[static_cast<std::size_t>(k)]) << k;
  EXPECT_EQ(comet_wave_begin(1, 1), 1);
  EXPECT_EQ(comet_wave_begin(1, 5), 1);
}
