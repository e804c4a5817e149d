#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "step_fixture.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/routing.hpp"

using namespace tilemoe;
using ::testing::HasSubstr;

namespace {

MoeConfig config(std::int64_t tokens, std::int64_t experts, std::int64_t k) {
  return tilemoe::testing::routing_config(tokens, experts, k);
}

}  // namespace

TEST(Routing, PicksTheLargestInDescendingOrder) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f};
  const Routing r = route(config(1, 4, 2), logits, 0);
  EXPECT_EQ(r.expert[0], 1);
  EXPECT_EQ(r.expert[1], 3);
  double z = 0;
  for (float l : logits) z += std::exp(double(l) - 2.0);
  EXPECT_NEAR(r.weight[0], 1.0 / z, 1e-6);
  EXPECT_NEAR(r.weight[1], std::exp(-0.5) / z, 1e-6);
  EXPECT_GT(r.weight[0], r.weight[1]);
}

TEST(Routing, TiesGoToTheLowerExpertId) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 1.0f, 3.0f};
  const Routing r = route(config(1, 5, 4), logits, 0);
  EXPECT_EQ(r.expert, (std::vector<std::int32_t>{1, 2, 4, 0}));
}

TEST(Routing, RenormalisesWhenAsked) {
  MoeConfig c = config(1, 4, 2);
  c.renormalize = true;
  const Routing r = route(c, std::vector<float>{0.1f, 2.0f, -1.0f, 1.5f}, 0);
  EXPECT_NEAR(r.weight[0] + r.weight[1], 1.0f, 1e-6);
  EXPECT_NEAR(r.weight[0] / r.weight[1], std::exp(0.5), 1e-5);
}

TEST(Routing, TopKEqualsExperts) {
  const Routing r = route(config(2, 3, 3), std::vector<float>{0, 1, 2, 2, 1, 0}, 0);
  EXPECT_EQ(r.expert, (std::vector<std::int32_t>{2, 1, 0, 0, 1, 2}));
}

TEST(Routing, NaNAndInfAreErrorsNamingRankTokenAndExpert) {
  std::vector<float> logits(12, 0.5f);
  logits[7] = std::numeric_limits<float>::quiet_NaN();
  try {
    route(config(3, 4, 2), logits, 5);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput);
    EXPECT_THAT(e.what(), HasSubstr("rank 5, token 1: router logit for expert 3 is NaN"));
  }
  logits[7] = 0;
  logits[8] = -std::numeric_limits<float>::infinity();
  try {
    route(config(3, 4, 2), logits, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("token 2: router logit for expert 0 is infinite"));
  }
}

TEST(Routing, WrongLogitCountIsBadInput) {
  EXPECT_THROW(route(config(3, 4, 2), std::vector<float>(11, 0.0f), 0), Error);
}

TEST(Routing, ZeroTokens) {
  const Routing r = route(config(0, 4, 2), std::vector<float>{}, 0);
  EXPECT_EQ(r.tokens, 0);
  EXPECT_TRUE(r.expert.empty());
}

TEST(Capacity, KeepsFirstChoicesFirstAndDropsBeyondCapacity) {
  // 4 tokens, 2 experts, top-1... use top-2 of 2: every token picks both.
  MoeConfig c = config(4, 2, 2);
  c.capacity_factor = 0.5;  // capacity = ceil(0.5 * 4 * 2 / 2) = 2
  EXPECT_EQ(expert_capacity(c), 2);
  // tokens 0..2 prefer expert 0, token 3 prefers expert 1
  const std::vector<float> logits = {2, 0, 2, 0, 2, 0, 0, 2};
  const Routing r = route(c, logits, 0);
  // slot-0 pass: t0->e0 keep, t1->e0 keep, t2->e0 drop, t3->e1 keep;
  // slot-1 pass: t0->e1 keep (e1 now full), t1->e1 drop, t2->e1 drop, t3->e0 drop
  EXPECT_EQ(r.kept, (std::vector<std::uint8_t>{1, 1, 1, 0, 0, 0, 1, 0}));
}

TEST(Capacity, DroplessKeepsEverything) {
  const Routing r = route(config(8, 4, 2), std::vector<float>(32, 1.0f), 0);
  for (auto k : r.kept) EXPECT_EQ(k, 1);
}

TEST(Capacity, AFactorBeyondTheTokensKeepsEverySlotInsteadOfOverflowing) {
  // 1e300 * tokens * k / E is far past int64: the conversion used to give a negative capacity
  // that dropped every slot
  MoeConfig c = config(4, 2, 2);
  for (const double factor : {1.0, 1e6, 1e300}) {
    c.capacity_factor = factor;
    EXPECT_EQ(expert_capacity(c), 4) << factor;
    if (factor > kMaxCapacityFactor) {  // route() refuses it first
      EXPECT_THROW(route(c, std::vector<float>(8, 0.0f), 0), Error);
      continue;
    }
    const Routing r = route(c, std::vector<float>{2, 0, 2, 0, 2, 0, 0, 2}, 0);
    EXPECT_EQ(r.kept, std::vector<std::uint8_t>(8, 1)) << factor;
  }
}
