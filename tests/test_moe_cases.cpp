// The case registry of the GPU tests and the benchmarks: every case a valid layer and world,
// ids unique, each kind and mode populated, selection by id strict.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "moe_cases.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;
using ::testing::HasSubstr;

TEST(MoeCases, EveryCaseIsAValidLayerAndWorldWithAUniqueId) {
  std::set<std::string> ids;
  for (const cases::MoeCase& c : cases::registry()) {
    EXPECT_TRUE(ids.insert(c.id()).second) << "two cases are " << c.id();
    for (const cases::Mode mode : {cases::kTest, cases::kPerf}) {
      EXPECT_NO_THROW(validate(c.world(mode))) << c.id();
    }
    EXPECT_EQ(c.experts % c.ranks, 0) << c.id() << ": every rank owns the same number of experts";
    EXPECT_EQ(c.hidden % 8, 0) << c.id() << ": the GEMMs' K and N are multiples of 8";
    EXPECT_NE(c.modes, 0u) << c.id();
    EXPECT_GT(c.tolerance, 0.0);
    EXPECT_LE(c.tolerance, cases::kBf16Tolerance);
  }
}

TEST(MoeCases, EachKindHasTestAndPerfCasesAndTheModelsAreBenchmarked) {
  for (const bool ep : {false, true}) {
    EXPECT_FALSE(cases::select_cases(ep, cases::kTest).empty());
    const auto perf = cases::select_cases(ep, cases::kPerf);
    ASSERT_FALSE(perf.empty());
    bool quick = false;
    for (const cases::MoeCase& c : perf) quick = quick || c.quick;
    EXPECT_TRUE(quick) << "a quick sweep exists";
  }
  for (const cases::ModelShape& shape : cases::model_shapes()) {
    bool timed = false;
    for (const cases::MoeCase& c : cases::select_cases(false, cases::kPerf)) timed = timed || c.name == shape.name;
    EXPECT_TRUE(timed) << shape.name;
  }
  // test worlds are uneven (rank r has 3r fewer tokens), perf worlds even
  const auto ep_tests = cases::select_cases(true, cases::kTest);
  const EpWorld world = ep_tests.front().world(cases::kTest);
  EXPECT_EQ(world.tokens_per_rank[1], world.tokens_per_rank[0] - 3);
  const EpWorld perf = cases::select_cases(true, cases::kPerf).front().world(cases::kPerf);
  EXPECT_EQ(perf.tokens_per_rank.front(), perf.tokens_per_rank.back());
}

TEST(MoeCases, SelectionByIdTakesAnyModeAndRefusesUnknownIds) {
  const auto chosen = cases::select_cases(false, cases::kTest, {"mixtral-8x7b:4096", "small:300"});
  ASSERT_EQ(chosen.size(), 2u);
  EXPECT_EQ(chosen[0].id(), "mixtral-8x7b:4096") << "a perf case runs in test mode when named";
  EXPECT_EQ(chosen[1].name, "small");
  EXPECT_EQ(cases::select_cases(true, cases::kPerf, {"deepseek-v3:16384:8"}).front().ranks, 8);
  try {
    cases::select_cases(true, cases::kPerf, {"mixtral-8x7b:4096"});  // a one-GPU id, asked of the expert-parallel kind
    FAIL() << "an unknown id was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput);
    EXPECT_THAT(e.what(), HasSubstr("no expert-parallel case 'mixtral-8x7b:4096'"));
    EXPECT_THAT(e.what(), HasSubstr("deepseek-v3:16384:8"));
  }
}
