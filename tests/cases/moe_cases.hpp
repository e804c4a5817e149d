#pragma once
// One registry of MoE layer cases for the GPU tests and the benches, after ggml's
// test-backend-ops: each case names a layer, a world and a routing, with the tolerance its
// outputs are held to and the modes it runs in. A test program runs the cases of its kind in
// test mode (outputs against the oracle, tests/cases/oracle.hpp), a benchmark in perf mode
// (timed); either accepts any case of its kind by id (`--case mixtral-8x7b:4096`), so a
// benchmark's shape can be checked for correctness and a test's shape timed.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tilemoe/config.hpp"
#include "tilemoe/shared_expert.hpp"
#include "tilemoe/weights.hpp"
#include "tilemoe/synthetic.hpp"

namespace tilemoe::cases {

// Relative Frobenius errors of bf16 steps stay near 3e-3 against fp64 (storage rounding); 1e-2
// leaves room for the GPU's other accumulation order, and catches any wrong row or weight.
constexpr double kBf16Tolerance = 1e-2;

// The published models the benchmarks are shaped after (one MoE layer each).
struct ModelShape {
  const char* name;
  std::int64_t hidden, ffn, experts, top_k;
};
const std::vector<ModelShape>& model_shapes();  // mixtral-8x7b, qwen3-30b-a3b, deepseek-v3

enum Mode : unsigned { kTest = 1, kPerf = 2 };

struct MoeCase {
  std::string name;         // a model's name, or what the case exercises
  int ranks = 1;            // 1: the one-GPU layer; more: the expert-parallel layer on a world
  std::int64_t tokens = 0;  // per rank; test worlds give rank r 3r fewer (uneven on purpose)
  std::int64_t hidden = 0, ffn = 0, experts = 0, top_k = 0;
  Activation activation = Activation::SwiGLU;
  bool renormalize = false;
  RoutingPattern pattern = RoutingPattern::Balanced;
  bool zero_token_rank = false;  // the last rank forwards no tokens
  int sms_per_rank = 0;          // > 0: every rank on an SM partition of this many SMs
  double tolerance = kBf16Tolerance;
  unsigned modes = kTest;
  bool quick = false;  // perf mode: part of the quick sweep

  // "mixtral-8x7b:4096" (one GPU) or "deepseek-v3:16384:8": unique in the registry
  std::string id() const;
  bool expert_parallel() const { return ranks > 1; }
  // small enough for compute-sanitizer (the --small runs): at most 4 ranks, a small product
  bool small() const;
  // the layer a rank builds: `tokens` = the most any rank forwards
  MoeConfig config() const;
  // every rank's tokens: all `tokens` in perf mode; in test mode rank r has 3r fewer and, with
  // zero_token_rank, the last none
  EpWorld world(Mode mode) const;
};

// Every case, tests' and benchmarks'.
const std::vector<MoeCase>& registry();
// A case's place in the registry: a seed offset that does not depend on which cases a run selects.
std::uint64_t registry_place(const MoeCase& c);

// The cases of one kind (one GPU or expert parallel) and mode, in registry order; or, when
// `ids` is not empty, the cases of that kind with those ids, in the order given, whatever their
// mode. An id of no case of that kind is bad input naming the ids there are.
std::vector<MoeCase> select_cases(bool expert_parallel, Mode mode, const std::vector<std::string>& ids = {});

// A shared expert `ffn` wide for `layer` (shared_expert.hpp), weights drawn as random_weights
// draws an expert's, and with `gated` a gate row that spreads sigmoid over (0.1, 0.9).
std::shared_ptr<const SharedExpert> random_shared_expert(const MoeConfig& layer, std::int64_t ffn, bool gated, std::uint64_t seed);

// GPT-OSS-like experts for `layer` (its dtype): random_weights with the gate and up matrices 4x
// larger, so that a few percent of unit inputs' gate and up values pass a clamp of 7, and biases
// drawn in (-0.5, 0.5) (ExpertWeights::b1, b3, b2).
ExpertWeights biased_weights(const MoeConfig& layer, std::uint64_t seed);

}  // namespace tilemoe::cases
