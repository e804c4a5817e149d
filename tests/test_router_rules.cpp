// The routing rules of real models beyond Mixtral's (MoeConfig::router; routing.hpp gives the
// order): each held against an independent double-precision statement of the rule as
// transformers writes it (DeepseekV3TopkRouter, GPT-OSS's router, DeepSeek-V4's sqrt-softplus),
// the one place where transformers' masking decides the choice, bad input, and every strategy
// giving the same bits on such a routing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "step_fixture.hpp"
#include "tilemoe/cpu_executor.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/routing.hpp"

using namespace tilemoe;
using ::testing::HasSubstr;

namespace {

MoeConfig config(std::int64_t tokens, std::int64_t experts, std::int64_t k) {
  return tilemoe::testing::routing_config(tokens, experts, k);
}

std::vector<float> random_values(std::size_t n, float scale, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// One token's experts and weights by the rule in double precision, written from the model
// code's description: scores, biased choice scores, group scores as the two best of each group
// (sorted), the best groups kept and the others' choice scores -inf, the k best choices, their
// unbiased scores (or a softmax over them), renormalised with epsilon, scaled.
struct Expected {
  std::vector<int> experts;
  std::vector<double> weights;
};
Expected reference_route(const MoeConfig& c, const float* logits, const std::vector<float>& bias) {
  const RouterConfig& r = c.router;
  const int E = static_cast<int>(c.num_experts), k = static_cast<int>(c.top_k);
  std::vector<double> score(E), choice(E);
  double top = -INFINITY, total = 0;
  for (int e = 0; e < E; ++e) top = std::max(top, double(logits[e]));
  for (int e = 0; e < E; ++e) total += std::exp(double(logits[e]) - top);
  for (int e = 0; e < E; ++e) {
    const double x = logits[e];
    switch (r.score) {
      case ScoreFunction::Softmax: score[e] = std::exp(x - top) / total; break;
      case ScoreFunction::Sigmoid: score[e] = 1.0 / (1.0 + std::exp(-x)); break;
      case ScoreFunction::SqrtSoftplus: score[e] = std::sqrt(x > 20 ? x : std::log(1.0 + std::exp(x))); break;
      case ScoreFunction::Logits: score[e] = x; break;
    }
    choice[e] = score[e] + (bias.empty() ? 0.0 : bias[e]);
  }
  if (r.groups > 1) {
    const int G = static_cast<int>(r.groups), size = E / G;
    std::vector<std::pair<double, int>> groups;
    for (int g = 0; g < G; ++g) {
      std::vector<double> members(choice.begin() + g * size, choice.begin() + (g + 1) * size);
      std::sort(members.rbegin(), members.rend());
      groups.push_back({-(members[0] + members[1]), g});
    }
    std::sort(groups.begin(), groups.end());
    for (int i = static_cast<int>(r.top_groups); i < G; ++i) {
      for (int e = groups[i].second * size; e < (groups[i].second + 1) * size; ++e) choice[e] = -INFINITY;
    }
  }
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return choice[a] > choice[b]; });
  Expected out;
  for (int j = 0; j < k; ++j) {
    out.experts.push_back(order[j]);
    out.weights.push_back(score[order[j]]);
  }
  if (r.weights == RouterWeights::SoftmaxOfSelected) {
    const double m = *std::max_element(out.weights.begin(), out.weights.end());
    double sum = 0;
    for (double& w : out.weights) sum += (w = std::exp(w - m));
    for (double& w : out.weights) w /= sum;
  }
  if (c.renormalize) {
    const double sum = std::accumulate(out.weights.begin(), out.weights.end(), 0.0);
    for (double& w : out.weights) w /= sum + r.renormalize_epsilon;
  }
  for (double& w : out.weights) w *= r.scaling;
  return out;
}

// Every token of `logits` routed by route() and by the reference: the same experts in the same
// slots, the weights within a few fp32 rounding steps.
void expect_matches_reference(const MoeConfig& c, const std::vector<float>& logits, const std::vector<float>& bias) {
  const Routing routing = route(c, logits, 0, bias);
  for (std::int64_t t = 0; t < c.tokens; ++t) {
    const Expected want = reference_route(c, logits.data() + t * c.num_experts, bias);
    for (std::int64_t j = 0; j < c.top_k; ++j) {
      const std::size_t s = routing.slot(t, j);
      ASSERT_EQ(routing.expert[s], want.experts[static_cast<std::size_t>(j)]) << "token " << t << " slot " << j;
      EXPECT_NEAR(routing.weight[s], want.weights[static_cast<std::size_t>(j)], 2e-6 * std::max(1.0, std::abs(want.weights[j])))
          << "token " << t << " slot " << j;
    }
  }
}

}  // namespace

TEST(RouterRules, DeepSeekV3SigmoidBiasGroupsRenormalisedAndScaled) {
  MoeConfig c = config(300, 32, 4);
  c.renormalize = true;
  c.router.score = ScoreFunction::Sigmoid;
  c.router.groups = 8;
  c.router.top_groups = 3;
  c.router.renormalize_epsilon = 1e-20f;
  c.router.scaling = 2.5f;
  expect_matches_reference(c, random_values(300 * 32, 2.0f, 1), random_values(32, 0.1f, 2));
  expect_matches_reference(c, random_values(300 * 32, 2.0f, 3), {});  // no selection bias
}

TEST(RouterRules, TheBiasChoosesButDoesNotWeigh) {
  // expert 3 has the lowest score but a bias that makes it the first choice; its weight is its
  // unbiased score
  MoeConfig c = config(1, 4, 2);
  c.router.score = ScoreFunction::Sigmoid;
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f};
  const Routing r = route(c, logits, 0, std::vector<float>{0.0f, 0.0f, 0.0f, 5.0f});
  EXPECT_EQ(r.expert[0], 3);
  EXPECT_EQ(r.expert[1], 1);
  EXPECT_FLOAT_EQ(r.weight[0], 1.0f / (1.0f + std::exp(1.0f)));
}

TEST(RouterRules, MaskedGroupsAreNeverChosenAsTransformersMasksThem) {
  // every kept expert's biased score is negative, and still only the kept group's experts are
  // chosen: masked ones count as -inf (transformers 5.x's masked_fill(-inf); 4.x's 0.0 would have
  // chosen the other group's)
  MoeConfig c = config(1, 4, 2);
  c.router.score = ScoreFunction::Sigmoid;
  c.router.groups = 2;
  c.router.top_groups = 1;
  const std::vector<float> logits = {0.3f, -0.2f, 0.1f, 0.4f};
  const std::vector<float> bias = {-1.0f, -1.0f, -2.0f, -2.0f};  // group 0 kept (less negative)
  const Routing r = route(c, logits, 0, bias);
  EXPECT_EQ(std::set<int>({r.expert[0], r.expert[1]}), std::set<int>({0, 1}));
  expect_matches_reference(c, logits, bias);
}

TEST(RouterRules, SqrtSoftplusAcrossTheThreshold) {
  MoeConfig c = config(64, 16, 3);
  c.renormalize = true;
  c.router.score = ScoreFunction::SqrtSoftplus;
  c.router.renormalize_epsilon = 1e-20f;
  c.router.scaling = 1.5f;
  std::vector<float> logits = random_values(64 * 16, 12.0f, 5);  // many past softplus' threshold of 20
  expect_matches_reference(c, logits, random_values(16, 0.5f, 6));
}

TEST(RouterRules, GptOssSoftmaxOverTheSelectedLogits) {
  MoeConfig c = config(100, 32, 4);
  c.router.score = ScoreFunction::Logits;
  c.router.weights = RouterWeights::SoftmaxOfSelected;
  const std::vector<float> logits = random_values(100 * 32, 3.0f, 7);
  expect_matches_reference(c, logits, {});
  // the same experts as softmax-then-top-k, and the weights of its renormalised probabilities
  MoeConfig mixtral = config(100, 32, 4);
  mixtral.renormalize = true;
  const Routing a = route(c, logits, 0), b = route(mixtral, logits, 0);
  EXPECT_EQ(a.expert, b.expert);
  for (std::size_t s = 0; s < a.weight.size(); ++s) EXPECT_NEAR(a.weight[s], b.weight[s], 1e-6);
}

TEST(RouterRules, BadRouterSettingsSayWhatToChange) {
  const std::vector<float> logits(8 * 1, 0.5f);
  auto refusal = [&](MoeConfig c, std::vector<float> bias = {}) {
    try {
      route(c, logits, 0, bias);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::BadInput);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  MoeConfig c = config(1, 8, 2);
  c.router.groups = 3;
  EXPECT_THAT(refusal(c), HasSubstr("must divide num_experts"));
  c.router.groups = 2;
  c.router.top_groups = 3;
  EXPECT_THAT(refusal(c), HasSubstr("top_groups = 3 is outside"));
  c.router.groups = 8;
  c.router.top_groups = 1;
  EXPECT_THAT(refusal(c), HasSubstr("each group needs at least 2"));
  c.router.groups = 4;
  c.top_k = 3;
  EXPECT_THAT(refusal(c), HasSubstr("raise top_groups"));
  c = config(1, 8, 2);
  c.router.renormalize_epsilon = -1.0f;
  EXPECT_THAT(refusal(c), HasSubstr("renormalize_epsilon"));
  c = config(1, 8, 2);
  c.router.scaling = 0.0f;
  EXPECT_THAT(refusal(c), HasSubstr("scaling"));
  c.router.scaling = INFINITY;
  EXPECT_THAT(refusal(c), HasSubstr("scaling"));
  c = config(1, 8, 2);
  EXPECT_THAT(refusal(c, std::vector<float>(7, 0.0f)), HasSubstr("one per expert is 8"));
  std::vector<float> nan_bias(8, 0.0f);
  nan_bias[5] = NAN;
  EXPECT_THAT(refusal(c, nan_bias), HasSubstr("expert 5 is not finite"));
  EXPECT_THROW(parse_score_function("relu"), Error);
  EXPECT_EQ(parse_score_function(score_function_name(ScoreFunction::SqrtSoftplus)), ScoreFunction::SqrtSoftplus);
  EXPECT_EQ(parse_router_weights(router_weights_name(RouterWeights::SoftmaxOfSelected)), RouterWeights::SoftmaxOfSelected);
}

TEST(RouterRules, TheGateProjectionInFp32RoundedToTheModelsDtype) {
  const std::int64_t tokens = 7, hidden = 40, experts = 6;
  const std::vector<float> x = random_values(tokens * hidden, 1.0f, 12), gate = random_values(experts * hidden, 0.3f, 13);
  const Matrix input = Matrix::from_floats(DType::BF16, tokens, hidden, x);
  const std::vector<float> fp32 = router_logits(input, gate, experts, DType::F32);
  const std::vector<float> bf16 = router_logits(input, gate, experts, DType::BF16);
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t e = 0; e < experts; ++e) {
      double want = 0;
      for (std::int64_t h = 0; h < hidden; ++h) want += double(input.at(t, h)) * double(gate[static_cast<std::size_t>(e * hidden + h)]);
      const std::size_t i = static_cast<std::size_t>(t * experts + e);
      EXPECT_NEAR(fp32[i], want, 1e-5 * std::max(1.0, std::abs(want)));
      EXPECT_EQ(bf16[i], round_to(DType::BF16, fp32[i]));
    }
  }
  EXPECT_THAT([&] {
    try {
      router_logits(input, std::vector<float>(5), experts, DType::F32);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  }(), HasSubstr("gate weight has 5 values"));
}

TEST(RouterRules, EveryStrategyGivesTheSameBitsOnDeepSeekRouting) {
  EpWorld world = tilemoe::testing::make_world({37, 50, 0, 29}, 32, 48, 16, 4);
  world.layer.renormalize = true;
  world.layer.router = {ScoreFunction::Sigmoid, 4, 2, RouterWeights::Scores, 1e-20f, 2.5f};
  const SyntheticStep step = synthetic_step(world, RoutingPattern::Balanced, 9);
  const std::vector<Routing> routing = route_world(world, step.logits, random_values(16, 0.1f, 10));
  const ExpertWeights weights = random_weights(world.layer, 11);
  PlanOptions o;
  o.tile_m = 8;
  o.tile_n = 16;
  const StepRun sequential = run_step(compile_plan(Strategy::Sequential, world, routing, o), weights, step.inputs);
  for (Strategy s : {Strategy::TileSignal, Strategy::Comet}) {
    const StepRun other = run_step(compile_plan(s, world, routing, o), weights, step.inputs);
    for (std::size_t r = 0; r < sequential.outputs.size(); ++r) {
      EXPECT_TRUE(sequential.outputs[r].bitwise_equal(other.outputs[r])) << strategy_name(s) << " rank " << r;
    }
  }
}
