// The token sample of the references: the whole step where the work bound allows, else evenly
// spaced tokens of every rank whose sub-step references equal the whole step's rows.
#include <gtest/gtest.h>

#include "step_fixture.hpp"
#include "tilemoe/reference.hpp"
#include "tilemoe/token_sample.hpp"

using namespace tilemoe;

TEST(TokenSample, TheWholeStepWhenTheWorkFits) {
  const EpWorld world = tilemoe::testing::make_world({5, 0, 7}, 16, 32, 3, 2);
  const auto step = tilemoe::testing::make_case(world, RoutingPattern::Balanced, 11);
  const TokenSample sample = sample_tokens(world, step.routing, 1e12);
  EXPECT_TRUE(sample.whole());
  EXPECT_EQ(sample.sampled, 12);
  EXPECT_EQ(sample.tokens[0], (std::vector<std::int64_t>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(sample.tokens[1].empty());
}

TEST(TokenSample, PastTheBoundEveryRankIsSampledEvenlyWithinTheBudget) {
  const EpWorld world = tilemoe::testing::make_world({1000, 3, 0, 1}, 16, 32, 4, 2);
  const auto step = tilemoe::testing::make_case(world, RoutingPattern::Balanced, 12);
  const double per_row = reference_work_per_row(world.layer);
  EXPECT_EQ(per_row, 16.0 * 32.0 * 3.0);
  const double budget = 100.0 * 2.0 * per_row;  // about 100 tokens of two kept slots
  const TokenSample sample = sample_tokens(world, step.routing, budget);
  EXPECT_FALSE(sample.whole());
  EXPECT_EQ(sample.total, 1004);
  const std::vector<std::int64_t>& big = sample.tokens[0];
  ASSERT_GE(big.size(), 90u);
  ASSERT_LE(big.size(), 100u);
  EXPECT_EQ(big.front(), 0);
  EXPECT_EQ(big.back(), 999) << "the last token is looked at too";
  for (std::size_t i = 1; i < big.size(); ++i) {
    EXPECT_LT(big[i - 1], big[i]);
    EXPECT_LE(big[i] - big[i - 1], 12) << "evenly spaced";
  }
  EXPECT_EQ(sample.tokens[1].size(), 1u) << "a small rank still gets a token";
  EXPECT_TRUE(sample.tokens[2].empty());
  EXPECT_EQ(sample.tokens[3], std::vector<std::int64_t>{0});
  std::int64_t count = 0;
  for (const auto& t : sample.tokens) count += static_cast<std::int64_t>(t.size());
  EXPECT_EQ(count, sample.sampled);
}

TEST(TokenSample, TheSubStepsReferencesAreTheWholeStepsRows) {
  const EpWorld world = tilemoe::testing::make_world({40, 17}, 24, 40, 4, 2);
  const auto step = tilemoe::testing::make_case(world, RoutingPattern::Skewed, 13);
  const TokenSample sample = sample_tokens(world, step.routing, 10.0 * 2.0 * reference_work_per_row(world.layer));
  ASSERT_FALSE(sample.whole());
  const SampledStep sub = sampled_step(sample, world, step.inputs, step.routing);
  EXPECT_EQ(sub.world.tokens_per_rank[0], static_cast<std::int64_t>(sample.tokens[0].size()));
  const std::vector<Matrix> whole = dense_reference(world, step.inputs, step.routing, step.weights);
  const std::vector<Matrix> part = dense_reference(sub.world, sub.inputs, sub.routing, step.weights);
  const std::vector<Matrix> rows = sampled_rows(sample, whole);
  ASSERT_EQ(rows.size(), part.size());
  for (std::size_t r = 0; r < rows.size(); ++r) EXPECT_TRUE(rows[r].bitwise_equal(part[r])) << "rank " << r;
  const auto fp64_whole = fp64_reference(world, step.inputs, step.routing, step.weights);
  const auto fp64_part = fp64_reference(sub.world, sub.inputs, sub.routing, step.weights);
  const std::int64_t h = world.layer.hidden;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    for (std::size_t i = 0; i < sample.tokens[r].size(); ++i) {
      for (std::int64_t c = 0; c < h; ++c) {
        ASSERT_EQ(fp64_part[r][i * static_cast<std::size_t>(h) + static_cast<std::size_t>(c)],
                  fp64_whole[r][static_cast<std::size_t>(sample.tokens[r][i] * h + c)]);
      }
    }
  }
}
