#pragma once
// The options that describe one step (layer, world, strategy knobs, data), shared by the
// subcommands, and how they become a ready-to-run step.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tilemoe/config.hpp"
#include "tilemoe/plan.hpp"
#include "tilemoe/routing.hpp"
#include "tilemoe/synthetic.hpp"
#include "tilemoe/tensor.hpp"
#include "tilemoe/weights.hpp"

namespace tilemoe::cli {

// Option checks shared by the subcommands (CLI11 accepts these values on its own).
extern const CLI::Validator kNotNegative;       // for unsigned options: "-1" is refused, not wrapped

struct StepOptions;
// --dispatch-volume as given, or nothing when not given (the GPU layer then picks its default).
std::optional<DispatchVolume> given_dispatch_volume(const StepOptions& options);

struct StepOptions {
  int ranks = 4;
  std::int64_t tokens = 128;  // per rank, unless tokens_per_rank is given
  std::string tokens_per_rank_text;  // "128,0,7,64", split and checked by world_from_options
  CLI::Option* tokens_per_rank_option = nullptr;
  bool tokens_per_rank_given() const { return tokens_per_rank_option != nullptr && tokens_per_rank_option->count() > 0; }
  std::int64_t hidden = 256, ffn_hidden = 896, experts = 8, top_k = 2;  // Mixtral's proportions, small
  std::string activation = "swiglu";
  bool renormalize = false;
  std::string score_function = "softmax", router_weights = "scores";
  std::int64_t expert_groups = 1, top_groups = 1;
  float renormalize_epsilon = 0.0f, routed_scaling = 1.0f;
  bool scale_expert_input = false;
  std::string router_logits_dtype;  // the gate's output dtype; empty: the layer's
  double capacity_factor = 0.0;
  std::string dtype = "bf16";
  std::string routing = "balanced";
  std::uint64_t seed = 1;
  std::string inputs_path, weights_path;
  std::string model_path;          // --model: a Hugging Face model directory
  std::int64_t model_layer = -1;   // --layer: which of its layers
  PlanOptions plan;
  CLI::Option* dispatch_volume_option = nullptr;  // --dispatch-volume (plan.dispatch), given or not
  std::string max_memory;  // --max-memory; empty: the memory this machine has available
  int strategies = 1;      // how many strategies the command runs one after another (memory estimate)
  // the command only compiles plans (validate-plan): no expert weights are drawn, no references
  // or row buffers counted (a --model layer's tensors are still read: its router is among them)
  bool plans_only = false;
  bool cpu_engine = true;  // the CPU engine runs the whole step (memory estimate; the CUDA backend's oracle is a sample)

  CLI::Option* tokens_option = nullptr;
  CLI::Option* hidden_option = nullptr;
  CLI::Option* ffn_option = nullptr;
  CLI::Option* experts_option = nullptr;
  CLI::Option* dtype_option = nullptr;
  CLI::Option* routing_option = nullptr;
  // the options that describe the layer, which a --model's config.json gives instead
  std::vector<CLI::Option*> layer_options;

  void add_to(CLI::App& app);
};

struct PreparedStep {
  EpWorld world;
  std::vector<Matrix> inputs;
  std::vector<std::vector<float>> logits;  // per rank, [tokens, experts]
  std::vector<Routing> routing;
  std::vector<float> selection_bias;  // the router's, from --weights (empty: none)
  // the router's gate when it computed the logits (from --weights, the --inputs file having
  // none): [experts][hidden], and the dtype the logits were rounded to. The GPU layer then
  // projects them itself.
  std::vector<float> router_gate;
  DType router_logits_dtype = DType::F32;
  ExpertWeights weights;  // with the shared expert of a --model layer that has one
  std::string source;  // what the data is, for the report
};

// The world the options describe (file_tokens >= 0: the token count of an --inputs file,
// split over --ranks unless --tokens-per-rank), validated; no data.
EpWorld world_from_options(const StepOptions& options, std::int64_t file_tokens = -1);

// Builds the step: the layer from the options and the files, inputs and logits from
// --inputs or synthetic, weights from --weights or random; routes every rank. Before the data
// and again before the weights and the run, the step's memory is estimated and a step that
// would not fit (--max-memory, or what the machine has available) is refused (bad input).
// `check_world`, when given, sees the world first, before any data exists (a backend's own
// refusals: the GPU's memory), with the width of the layer's shared expert (0: none; a --model's
// config.json says it, a --weights file's is not known before it is read).
using WorldCheck = std::function<void(const EpWorld& world, std::int64_t shared_ffn_hidden)>;
PreparedStep prepare_step(const StepOptions& options, const WorldCheck& check_world = {});

}  // namespace tilemoe::cli
