// Model directories made by Hugging Face transformers (scripts/make_model_fixtures.py, checked in
// under tests/fixtures/models and remade by the device script): tilemoe reads each family's
// checkpoint as saved - whole, sharded, per-expert or fused - and its layer gives what
// transformers' own MoE block gave: the same experts for every token, and outputs within 1e-5
// (fp32) or 1e-2 (bf16) of the output's scale, in the library and through `tilemoe run --model`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli_fixture.hpp"
#include "tilemoe/model_dir.hpp"
#include "tilemoe/reference.hpp"
#include "tilemoe/routing.hpp"
#include "tilemoe/safetensors.hpp"
#include "tilemoe/step_io.hpp"

namespace {

namespace fs = std::filesystem;
namespace st = tilemoe::safetensors;

const fs::path kFixtures = TILEMOE_MODEL_FIXTURES;

struct BlockCase {
  std::string name;
  std::int64_t layer = 0;
  std::vector<float> input, expected;
  std::vector<std::int64_t> input_shape;
  std::vector<std::int32_t> experts;  // [tokens, top_k] as transformers chose them, in any order
};

BlockCase read_case(const std::string& name) {
  const st::File file = st::File::open((kFixtures / name / "block_case.safetensors").string());
  BlockCase c;
  c.name = name;
  c.layer = std::stoll(file.metadata().at("layer"));
  c.input = file.read_f32(file.get("input"));
  c.input_shape = file.get("input").shape;
  c.expected = file.read_f32(file.get("expected"));
  const st::TensorInfo& experts = file.get("experts");
  const std::span<const std::byte> raw = file.bytes(experts);
  c.experts.resize(raw.size() / 4);
  std::memcpy(c.experts.data(), raw.data(), raw.size());
  return c;
}

std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(kFixtures)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// max |a - b| over the scale max |b|
double relative_max_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(double(a.at(i)) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / scale;
}

double tolerance(tilemoe::DType dtype) { return dtype == tilemoe::DType::F32 ? 1e-5 : 1e-2; }

TEST(ModelDirectory, EveryFamilysLayerIsTransformersBlock) {
  const std::vector<std::string> names = fixture_names();
  ASSERT_GE(names.size(), 11u) << "the fixtures of tests/fixtures/models are missing";
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const BlockCase c = read_case(name);
    const tilemoe::ModelDirectory model = tilemoe::ModelDirectory::open((kFixtures / name).string());
    const tilemoe::ModelLayer layer = model.layer(c.layer);
    const tilemoe::ModelLayerWeights weights = model.load(layer);
    const std::int64_t tokens = c.input_shape[0], k = layer.layer.top_k;

    const tilemoe::Matrix input = tilemoe::Matrix::from_floats(layer.layer.dtype, tokens, c.input_shape[1], c.input);
    const std::vector<float> logits = tilemoe::router_logits(input, weights.router.gate, layer.layer.num_experts, layer.router_logits_dtype,
                                                                 weights.router.gate_bias);
    tilemoe::EpWorld world{layer.layer, {tokens}};
    const std::vector<tilemoe::Routing> routing = tilemoe::route_world(world, {logits}, weights.router.selection_bias);
    for (std::int64_t t = 0; t < tokens; ++t) {
      std::vector<std::int32_t> ours(routing[0].expert.begin() + t * k, routing[0].expert.begin() + (t + 1) * k);
      std::vector<std::int32_t> theirs(c.experts.begin() + t * k, c.experts.begin() + (t + 1) * k);
      std::sort(ours.begin(), ours.end());
      std::sort(theirs.begin(), theirs.end());
      EXPECT_EQ(ours, theirs) << "token " << t;
    }
    const std::vector<tilemoe::Matrix> output = tilemoe::dense_reference(world, {input}, routing, weights.experts);
    EXPECT_LE(relative_max_error(output[0].to_floats(), c.expected), tolerance(layer.layer.dtype));
  }
}

TEST(ModelDirectory, AShardedModelReadsOnlyTheShardsOfItsLayer) {
  // the sharded fixture spreads its tensors over several files; a layer's load opens those that
  // hold its prefix, so a shard of another layer may be unreadable without harm
  const fs::path source = kFixtures / "mixtral_bf16_sharded";
  const fs::path copy = fs::temp_directory_path() / ("tilemoe_sharded_" + std::to_string(::getpid()));
  fs::remove_all(copy);
  fs::copy(source, copy);
  const tilemoe::ModelDirectory model = tilemoe::ModelDirectory::open(copy.string());
  const tilemoe::ModelLayer layer = model.layer(2);
  std::ifstream index(copy / "model.safetensors.index.json");
  const std::string text((std::istreambuf_iterator<char>(index)), std::istreambuf_iterator<char>());
  int broken = 0;
  for (const auto& entry : fs::directory_iterator(copy)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind("model-", 0) != 0) continue;
    // a shard that names none of layer 2's tensors in the index is replaced by garbage
    bool holds_layer = false;
    for (std::size_t at = text.find(layer.prefix); at != std::string::npos; at = text.find(layer.prefix, at + 1)) {
      const std::size_t value = text.find('"', text.find(':', at) + 1);
      holds_layer |= text.compare(value + 1, file.size(), file) == 0;
    }
    if (!holds_layer) {
      std::ofstream(entry.path(), std::ios::trunc) << "not a safetensors file";
      ++broken;
    }
  }
  ASSERT_GT(broken, 0) << "the fixture's layer 2 fills every shard; shard it finer";
  EXPECT_NO_THROW(model.load(layer));
  fs::remove_all(copy);
}

class ModelCli : public tilemoe::testing::Cli {};

TEST_F(ModelCli, RunOnEveryFamilyGivesTransformersOutput) {
  for (const std::string& name : fixture_names()) {
    SCOPED_TRACE(name);
    const BlockCase c = read_case(name);
    const std::string dir = (kFixtures / name).string();
    const tilemoe::testing::Result r = tilemoe("run --model " + dir + " --layer " + std::to_string(c.layer) + " --inputs " + dir +
                                               "/block_case.safetensors --ranks 2 --output " + path("out.safetensors"));
    ASSERT_EQ(r.code, 0) << r.err;
    const st::File out = st::File::open(path("out.safetensors"));
    const bool fp32 = out.get("output").type == st::ElementType::F32;
    EXPECT_LE(relative_max_error(out.read_f32(out.get("output")), c.expected), fp32 ? 1e-5 : 1e-2);
    int strategies = 0;  // each strategy's row ends with its "bitwise" verdict against the dense reference
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("sequential", 0) != 0 && line.rfind("tile_signal", 0) != 0 && line.rfind("comet", 0) != 0) continue;
      ++strategies;
      EXPECT_TRUE(line.ends_with("yes")) << "not bitwise the dense reference: " << line;
    }
    EXPECT_EQ(strategies, 3) << r.out;
  }
}

TEST_F(ModelCli, SyntheticInputsAreRoutedByTheModelsGate) {
  const std::string dir = (kFixtures / "deepseek_v3_fp32").string();
  const tilemoe::testing::Result r = tilemoe("run --model " + dir + " --layer 1 --tokens 7 --ranks 2 --seed 5");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("logits from the gate of " + dir), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("experts: a shared expert of ffn 32"), std::string::npos) << r.out;  // 2 shared experts of 16
  EXPECT_NE(r.out.find("sigmoid scores"), std::string::npos) << r.out;
}

TEST_F(ModelCli, BadModelOptionsAreRefusedSayingWhatToChange) {
  const std::string deepseek = (kFixtures / "deepseek_v3_fp32").string();
  struct Refusal {
    std::string args, fragment;
  };
  const std::vector<Refusal> refusals = {
      {"run --model " + deepseek, "give --layer N"},
      {"run --layer 2", "give --model too"},
      {"run --model " + deepseek + " --layer 0", "is a dense MLP, not a MoE block; its MoE layers include 1, 2"},
      {"run --model " + deepseek + " --layer 3", "has layers 0 to 2"},
      {"run --model " + deepseek + " --layer 2 --hidden 64", "--hidden describes the layer"},
      {"run --model " + deepseek + " --layer 2 --score-function softmax", "--score-function describes the layer"},
      {"run --model " + deepseek + " --layer 2 --weights " + deepseek + "/model.safetensors", "give one"},
      {"run --model " + path("nowhere") + " --layer 0", "is not a directory"},
      {"run --model " + deepseek + " --layer 2 --routing skewed", "drop --routing"},
  };
  for (const Refusal& refusal : refusals) {
    SCOPED_TRACE(refusal.args);
    const tilemoe::testing::Result r = tilemoe(refusal.args);
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find(refusal.fragment), std::string::npos) << r.err;
  }
}

TEST_F(ModelCli, AModelOfAnotherFamilyOrWithAShardOutsideItIsRefused) {
  const fs::path dir = path("model");
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "llama", "num_hidden_layers": 2})";
  tilemoe::testing::Result r = tilemoe("run --model " + dir.string() + " --layer 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("model_type \"llama\" is not one tilemoe reads (mixtral, qwen2_moe, qwen3_moe, deepseek_v3, gpt_oss, llama4_text, llama4)"), std::string::npos) << r.err;

  fs::copy(kFixtures / "mixtral_fp32" / "config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": {"model.layers.0.block_sparse_moe.gate.weight": "../x.safetensors"}})";
  r = tilemoe("run --model " + dir.string() + " --layer 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("is not a file name of the model's directory"), std::string::npos) << r.err;
}

}  // namespace
