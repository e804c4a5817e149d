// The tilemoe CLI, run as a user would: exit codes, messages, files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <sys/wait.h>

#include "cli_fixture.hpp"
#include "step_fixture.hpp"
#include "tilemoe/safetensors.hpp"
#include "tilemoe/step_io.hpp"

using namespace tilemoe;
using tilemoe::testing::Cli;
using tilemoe::testing::Result;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

namespace {

const std::string kSmall = " --tokens 24 --hidden 32 --ffn-hidden 48 --experts 8 --top-k 2 --ranks 4 ";

}  // namespace

TEST_F(Cli, RunPrintsTheTableWithEveryStrategyBitwiseEqual) {
  const Result r = tilemoe("run" + kSmall);
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* s : {"sequential", "tile_signal", "comet"}) EXPECT_THAT(r.out, HasSubstr(s));
  EXPECT_THAT(r.out, HasSubstr("bitwise"));
  EXPECT_THAT(r.out, Not(HasSubstr(" NO")));
  EXPECT_EQ(r.err, "");
}

TEST_F(Cli, JsonIsMachineReadable) {
  const Result r = tilemoe("run --json --routing skewed --tokens-per-rank 5,0,31,7 --hidden 16 --ffn-hidden 16 --experts 8");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto doc = nlohmann::json::parse(r.out);
  EXPECT_TRUE(doc["all_bitwise_equal"].get<bool>());
  EXPECT_EQ(doc["results"].size(), 3u);
  EXPECT_EQ(doc["layer"]["tokens_per_rank"], (std::vector<int>{5, 0, 31, 7}));
  for (const auto& entry : doc["results"]) {
    EXPECT_TRUE(entry["bitwise_equal_dense"].get<bool>());
    EXPECT_LT(entry["relative_error_vs_fp64"].get<double>(), 1e-2);
  }
}

TEST_F(Cli, ReferencesPastTheirWorkBoundCheckEvenlySpacedTokens) {
  // 96 tokens of 2 kept slots at 32 x 48 x 3 multiply-adds each: a bound of 1e5 affords ~10
  const Result r = tilemoe("run" + kSmall + "--reference-work 1e5");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("rel err fp64 on 8 of 96 tokens, evenly spaced on every rank"));
  const Result json = tilemoe("run --json" + kSmall + "--reference-work 1e5");
  ASSERT_EQ(json.code, 0) << json.err;
  const auto doc = nlohmann::json::parse(json.out);
  EXPECT_EQ(doc["fp64_tokens_checked"].get<int>(), 8);
  for (const auto& entry : doc["results"]) EXPECT_LT(entry["relative_error_vs_fp64"].get<double>(), 1e-2);
  const Result whole = tilemoe("run --json" + kSmall);
  EXPECT_EQ(nlohmann::json::parse(whole.out)["fp64_tokens_checked"].get<int>(), 96);
}

TEST_F(Cli, BadInputExitsWithTwoAndSaysWhatToChange) {
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"run --experts 6 --ranks 4", "not divisible by the world size 4"},
      {"run --reference-work 0", "--reference-work must be a positive finite number"},
      {"run --reference-work nan", "--reference-work must be a positive finite number"},
      {"run --hidden 12", "hidden = 12 is not a multiple of 8"},
      {"run --top-k 9", "top_k = 9 is outside"},
      {"run --strategy fastest", "unknown strategy 'fastest'"},
      {"run --dtype fp8", "unknown storage dtype"},
      {"run --routing wild", "unknown routing pattern"},
      {"run --timeout-ms 0", "--timeout-ms"},
      {"run --tokens -3", "negative"},
      {"run --mgb 9", "mgb = 9"},
      {"run --strategy auto", "auto picks a strategy per GPU layer"},
      {"run --backend tpu", "unknown backend 'tpu'"},
      {"run --no-such-option", "no-such-option"},
      {"run --inputs " + path("absent.safetensors"), "absent.safetensors"},
      {"frobnicate", "frobnicate"},
      {"run --silent-rank 1", "options of --backend cuda"},
      {"run --strategy comet --comet-send-ctas 2", "size comet's exchange on the GPU"},
      {"run --strategy comet --comet-dispatch-ctas -1", "is negative"},
#ifndef TILEMOE_WITH_CUDA  // with it, the answer depends on the machine's GPU (the GPU tests cover it)
      {"run --backend cuda --ranks 1", "this build has no CUDA backend"},
#else  // refused before any GPU is looked for
      {"run --backend cuda --ranks 2 --experts 4 --silent-rank 2", "names no rank of a world of 2"},
      {"run --backend cuda --ranks 1 --silent-rank 0", "needs --ranks 2 or more"},
#endif
  };
  for (const Case& c : cases) {
    const Result r = tilemoe(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.args;
  }
}

TEST_F(Cli, OutputIsWrittenOnSuccessAndNothingIsLeftOnFailure) {
  const std::string out = path("out.safetensors");
  Result r = tilemoe("run" + kSmall + "--strategy tile_signal --output " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto file = safetensors::File::open(out);
  EXPECT_EQ(file.get("output").shape, (std::vector<std::int64_t>{96, 32}));
  for (float v : file.read_f32(file.get("output"))) ASSERT_TRUE(std::isfinite(v));

  const std::string failed = path("failed.safetensors");
  r = tilemoe("run --ranks 3 --experts 8 --output " + failed);
  EXPECT_EQ(r.code, 2);
  EXPECT_FALSE(fs::exists(failed));
  for (const auto& entry : fs::directory_iterator(dir_)) EXPECT_THAT(entry.path().filename().string(), Not(HasSubstr(".tmp")));
}

namespace {

auto as_bytes(const std::vector<float>& v) {
  return std::span<const std::byte>(reinterpret_cast<const std::byte*>(v.data()), v.size() * 4);
}

// A step in the Hugging Face layout: `inputs` (input, router_logits) and `weights` (the experts
// under `prefix`, and `extra` tensors besides), random normal data of `seed`.
void write_hf_step(const std::string& inputs, const std::string& weights, const std::string& prefix, std::int64_t tokens,
                   std::int64_t hidden, std::int64_t ffn, std::int64_t experts, std::uint64_t seed,
                   const std::vector<safetensors::TensorToWrite>& extra = {}) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(tokens * hidden), logits(tokens * experts);
  for (float& v : x) v = normal(rng);
  for (float& v : logits) v = normal(rng);
  safetensors::write(inputs, {{"input", safetensors::ElementType::F32, {tokens, hidden}, as_bytes(x)},
                              {"router_logits", safetensors::ElementType::F32, {tokens, experts}, as_bytes(logits)}});
  std::vector<std::vector<float>> w(experts * 3);
  std::vector<safetensors::TensorToWrite> tensors = extra;
  for (std::int64_t e = 0; e < experts; ++e) {
    for (int m = 0; m < 3; ++m) {
      auto& values = w[static_cast<std::size_t>(e * 3 + m)];
      values.resize(static_cast<std::size_t>(hidden * ffn));
      for (float& v : values) v = normal(rng) * 0.2f;
      const char* name[] = {"w1", "w3", "w2"};
      const std::vector<std::int64_t> shape = m == 2 ? std::vector<std::int64_t>{hidden, ffn} : std::vector<std::int64_t>{ffn, hidden};
      tensors.push_back({prefix + "experts." + std::to_string(e) + "." + name[m] + ".weight", safetensors::ElementType::F32, shape,
                         as_bytes(values)});
    }
  }
  safetensors::write(weights, tensors);
}

// The CLI's output file against the library's dense reference of the same step.
void expect_output_is_dense_reference(const std::string& output, const EpWorld& world, const std::string& inputs,
                                      const std::string& weights_path, const std::vector<float>& bias = {}) {
  const StepInputs in = load_step_inputs(inputs, DType::BF16);
  const auto routing = route_world(world, split_logits_by_rank(in.logits, world.layer.num_experts, world.tokens_per_rank), bias);
  const auto weights = load_weights(weights_path, world.layer);
  const auto dense = dense_reference(world, split_by_rank(in.input, world.tokens_per_rank), routing, weights);
  const auto file = safetensors::File::open(output);
  const auto got = file.bytes(file.get("output"));
  std::vector<std::byte> expected;
  for (const Matrix& m : dense) expected.insert(expected.end(), m.data.begin(), m.data.end());
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_TRUE(std::equal(got.begin(), got.end(), expected.begin()));
}

}  // namespace

TEST_F(Cli, InputsAndWeightsFromFilesGiveTheDenseReferenceBitwise) {
  // a step written in the Hugging Face layout, run by the CLI, checked against the library's
  // dense reference on the same data
  const std::int64_t hidden = 16, ffn = 24, experts = 4;
  write_hf_step(path("inputs.safetensors"), path("weights.safetensors"), "model.layers.3.block_sparse_moe.", 19, hidden, ffn, experts, 7);

  const Result r = tilemoe("run --ranks 2 --top-k 2 --inputs " + path("inputs.safetensors") + " --weights " +
                           path("weights.safetensors") + " --output " + path("out.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;
  expect_output_is_dense_reference(path("out.safetensors"), tilemoe::testing::make_world({10, 9}, hidden, ffn, experts, 2),
                                   path("inputs.safetensors"), path("weights.safetensors"));

  // a file whose shapes disagree with an explicit option is refused
  const Result mismatch = tilemoe("run --hidden 64 --inputs " + path("inputs.safetensors"));
  EXPECT_EQ(mismatch.code, 2);
  EXPECT_THAT(mismatch.err, HasSubstr("disagrees with"));
}

TEST_F(Cli, DeepSeekRoutingWithTheBiasFromTheWeightsFile) {
  // the router's rule from the options, its selection bias from the weights file (DeepSeek-V3's
  // name), the output the library's dense reference on that routing
  const std::int64_t hidden = 16, ffn = 24, experts = 8;
  std::vector<float> bias(experts);
  for (std::int64_t e = 0; e < experts; ++e) bias[static_cast<std::size_t>(e)] = 0.05f * static_cast<float>(e % 3) - 0.04f;
  const std::string prefix = "model.layers.5.mlp.";
  write_hf_step(path("in.safetensors"), path("w.safetensors"), prefix, 21, hidden, ffn, experts, 9,
                {{prefix + "gate.e_score_correction_bias", safetensors::ElementType::F32, {experts}, as_bytes(bias)}});
  const std::string rule = " --top-k 3 --score-function sigmoid --expert-groups 4 --top-groups 2 --renormalize "
                           "--renormalize-epsilon 1e-20 --routed-scaling 2.5 ";
  const Result r = tilemoe("run --ranks 2" + rule + "--inputs " + path("in.safetensors") + " --weights " + path("w.safetensors") +
                           " --output " + path("out.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("router: sigmoid scores"));
  EpWorld world = tilemoe::testing::make_world({11, 10}, hidden, ffn, experts, 3);
  world.layer.renormalize = true;
  world.layer.router = {ScoreFunction::Sigmoid, 4, 2, RouterWeights::Scores, 1e-20f, 2.5f};
  expect_output_is_dense_reference(path("out.safetensors"), world, path("in.safetensors"), path("w.safetensors"), bias);
  // the bias changes the choice on this data (else the check above could not tell it was applied)
  const StepInputs in = load_step_inputs(path("in.safetensors"), DType::BF16);
  const auto logits = split_logits_by_rank(in.logits, experts, world.tokens_per_rank);
  EXPECT_NE(route_world(world, logits, bias)[0].expert, route_world(world, logits)[0].expert);

  // a bias of the wrong length is refused, naming the tensor
  const std::vector<float> short_bias(experts - 1, 0.0f);
  write_hf_step(path("in2.safetensors"), path("w2.safetensors"), prefix, 21, hidden, ffn, experts, 9,
                {{prefix + "gate.e_score_correction_bias", safetensors::ElementType::F32, {experts - 1}, as_bytes(short_bias)}});
  const Result bad = tilemoe("run --ranks 2" + rule + "--inputs " + path("in2.safetensors") + " --weights " + path("w2.safetensors"));
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("e_score_correction_bias"));
  EXPECT_THAT(bad.err, HasSubstr("one value per expert"));
}

TEST_F(Cli, QwenAndDeepSeekExpertNamesReadAsMixtrals) {
  // the same matrices under Qwen-MoE's and DeepSeek's names (gate_proj, up_proj, down_proj) give
  // the same weights, and so the same output bitwise; a file spelling one matrix both ways is refused
  const std::int64_t tokens = 9, hidden = 16, ffn = 24, experts = 4;
  const std::string prefix = "model.layers.2.mlp.";
  write_hf_step(path("in.safetensors"), path("mixtral.safetensors"), prefix, tokens, hidden, ffn, experts, 8);
  const auto mixtral = safetensors::File::open(path("mixtral.safetensors"));
  std::vector<safetensors::TensorToWrite> renamed, both;
  for (const auto& info : mixtral.tensors()) {
    std::string name = info.name;
    for (const auto& [from, to] : {std::pair{"w1.weight", "gate_proj.weight"}, {"w3.weight", "up_proj.weight"}, {"w2.weight", "down_proj.weight"}}) {
      if (name.ends_with(from)) name.replace(name.size() - std::string(from).size(), std::string::npos, to);
    }
    renamed.push_back({name, info.type, info.shape, mixtral.bytes(info)});
    both.push_back({info.name, info.type, info.shape, mixtral.bytes(info)});
  }
  safetensors::write(path("qwen.safetensors"), renamed);
  MoeConfig layer = tilemoe::testing::make_world({tokens}, hidden, ffn, experts, 2).layer;
  const ExpertWeights a = load_weights(path("mixtral.safetensors"), layer), b = load_weights(path("qwen.safetensors"), layer);
  EXPECT_EQ(a.w1t, b.w1t);
  EXPECT_EQ(a.w3t, b.w3t);
  EXPECT_EQ(a.w2t, b.w2t);
  std::string outputs[2];
  for (int i = 0; i < 2; ++i) {
    const Result r = tilemoe("run --ranks 2 --top-k 2 --inputs " + path("in.safetensors") + " --weights " +
                             path(i == 0 ? "mixtral.safetensors" : "qwen.safetensors") + " --output " + path("out.safetensors"));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto file = safetensors::File::open(path("out.safetensors"));
    const auto bytes = file.bytes(file.get("output"));
    outputs[i].assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  both.push_back(renamed.front());  // expert 0's first matrix once more, in the other spelling
  safetensors::write(path("both.safetensors"), both);
  const Result refused = tilemoe("run --ranks 2 --top-k 2 --inputs " + path("in.safetensors") + " --weights " + path("both.safetensors"));
  EXPECT_EQ(refused.code, 2);
  EXPECT_THAT(refused.err, HasSubstr("both name expert 0's"));
}

TEST_F(Cli, TheLogitsFromTheWeightsFilesGate) {
  // an inputs file without router_logits: the router's gate.weight in the weights file computes
  // them (in the layer dtype, or --router-logits-dtype)
  const std::int64_t tokens = 13, hidden = 16, ffn = 24, experts = 4;
  const std::string prefix = "model.layers.1.mlp.";
  std::vector<float> gate(experts * hidden);
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (float& v : gate) v = normal(rng);
  write_hf_step(path("in.safetensors"), path("w.safetensors"), prefix, tokens, hidden, ffn, experts, 5,
                {{prefix + "gate.weight", safetensors::ElementType::F32, {experts, hidden}, as_bytes(gate)}});
  const StepInputs with_logits = load_step_inputs(path("in.safetensors"), DType::BF16);
  safetensors::write(path("x.safetensors"), {{"input", safetensors::ElementType::BF16, {tokens, hidden},
                                              std::span<const std::byte>(with_logits.input.data)}});
  for (const char* dtype : {"bf16", "fp32"}) {
    const Result r = tilemoe("run --ranks 2 --top-k 2 --router-logits-dtype " + std::string(dtype) + " --inputs " + path("x.safetensors") +
                             " --weights " + path("w.safetensors") + " --output " + path("out.safetensors"));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("logits from the gate"));
    const EpWorld world = tilemoe::testing::make_world({7, 6}, hidden, ffn, experts, 2);
    const StepInputs in = load_step_inputs(path("x.safetensors"), DType::BF16);
    const std::vector<float> logits = router_logits(in.input, load_router_tensors(path("w.safetensors"), experts, hidden, DType::BF16).gate, experts,
                                                    parse_dtype(dtype));
    const auto routing = route_world(world, split_logits_by_rank(logits, experts, world.tokens_per_rank));
    const auto dense = dense_reference(world, split_by_rank(in.input, world.tokens_per_rank), routing,
                                       load_weights(path("w.safetensors"), world.layer));
    const auto file = safetensors::File::open(path("out.safetensors"));
    const auto got = file.bytes(file.get("output"));
    std::vector<std::byte> expected;
    for (const Matrix& m : dense) expected.insert(expected.end(), m.data.begin(), m.data.end());
    ASSERT_EQ(got.size(), expected.size());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), expected.begin())) << dtype;
  }
  // neither logits nor a gate: refused, saying what to give
  write_hf_step(path("in2.safetensors"), path("w2.safetensors"), prefix, tokens, hidden, ffn, experts, 5);
  const Result none = tilemoe("run --ranks 2 --inputs " + path("x.safetensors") + " --weights " + path("w2.safetensors"));
  EXPECT_EQ(none.code, 2);
  EXPECT_THAT(none.err, HasSubstr("has no 'router_logits'"));
  EXPECT_THAT(none.err, HasSubstr("gate.weight"));
}

TEST_F(Cli, CorruptOrInvalidInputFilesAreBadInput) {
  std::ofstream(path("garbage.safetensors")) << "this is not a safetensors file at all";
  Result r = tilemoe("run --inputs " + path("garbage.safetensors"));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("garbage.safetensors"));

  std::vector<float> x(4 * 8, 0.5f), logits(4 * 4, 0.0f);
  logits[9] = NAN;
  auto bytes = [](const std::vector<float>& v) { return std::span<const std::byte>(reinterpret_cast<const std::byte*>(v.data()), v.size() * 4); };
  safetensors::write(path("nan.safetensors"), {{"input", safetensors::ElementType::F32, {4, 8}, bytes(x)},
                                               {"router_logits", safetensors::ElementType::F32, {4, 4}, bytes(logits)}});
  r = tilemoe("run --ranks 2 --ffn-hidden 8 --top-k 1 --inputs " + path("nan.safetensors"));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("rank 1, token 0: router logit for expert 1 is NaN"));
}

TEST_F(Cli, TraceOpensAsTraceEventJsonWithFlows) {
  const Result r = tilemoe("run" + kSmall + "--trace " + path("trace.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto doc = nlohmann::json::parse(slurp(path("trace.json")));
  int spans = 0, flows = 0, tracks = 0;
  for (const auto& e : doc["traceEvents"]) {
    spans += e["ph"] == "X";
    flows += e["ph"] == "s";
    tracks += e["ph"] == "M" && e["name"] == "thread_name";
  }
  EXPECT_GT(spans, 100);
  EXPECT_GT(flows, 0) << "tile_signal segments wait for tile flags: arrows expected";
  EXPECT_EQ(tracks, 3 * 4 * 3);  // 3 strategies x 4 ranks x (2 compute + 1 comm) workers
}

TEST_F(Cli, ValidatePlanPrintsSummariesAndTheVerdict) {
  const Result r = tilemoe("validate-plan" + kSmall + "--routing one-expert");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("rank 3: comet"));
  EXPECT_THAT(r.out, HasSubstr("verdict: ok"));
  const Result bad = tilemoe("validate-plan --strategy tile_signal --tile-m 0");
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("tile_m = 0"));
}

TEST_F(Cli, BenchTimesEveryStrategy) {
  const Result r = tilemoe("bench --runs 2 --json" + kSmall);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto doc = nlohmann::json::parse(r.out);
  ASSERT_EQ(doc["results"].size(), 3u);
  for (const auto& entry : doc["results"]) EXPECT_GT(entry["median_ms"].get<double>(), 0.0);
  EXPECT_EQ(tilemoe("bench --runs 0").code, 2);
}

TEST_F(Cli, HelpExitsZero) {
  const Result r = tilemoe("run --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("--capacity-factor"));
}
