#include "step_options.hpp"

#include <filesystem>
#include <utility>

#include "progress.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/memory_estimate.hpp"
#include "tilemoe/model_dir.hpp"
#include "tilemoe/routing.hpp"
#include "tilemoe/step_io.hpp"

namespace tilemoe::cli {

// CLI11 reads "-1" into an unsigned option as 2^64 - 1 (strtoull wraps it): a seed of -1
// became 18446744073709551615 without a word.
const CLI::Validator kNotNegative(
    [](std::string& text) -> std::string {
      const std::size_t first = text.find_first_not_of(" \t");
      if (first != std::string::npos && text[first] == '-') return "'" + text + "' is negative: use 0 or more";
      return {};
    },
    "NOT NEGATIVE");

void StepOptions::add_to(CLI::App& app) {
  app.add_option("--ranks", ranks, "expert-parallel world size W (ranks are threads on the CPU)")->capture_default_str();
  tokens_option = app.add_option("--tokens", tokens, "tokens on every rank")->capture_default_str();
  // Read as text and split here: CLI11's delimiter drops empty entries, so "" became one rank of
  // no tokens and "8,,8" two ranks.
  tokens_per_rank_option = app.add_option("--tokens-per-rank", tokens_per_rank_text, "tokens of each rank, e.g. 128,0,7,64 (overrides --tokens and --ranks)");
  hidden_option = app.add_option("--hidden", hidden, "model width (multiple of 8)")->capture_default_str();
  ffn_option = app.add_option("--ffn-hidden", ffn_hidden, "expert inner width (multiple of 8)")->capture_default_str();
  experts_option = app.add_option("--experts", experts, "number of experts E (divisible by --ranks)")->capture_default_str();
  layer_options = {
      hidden_option, ffn_option, experts_option,
      app.add_option("--top-k", top_k, "experts per token")->capture_default_str(),
      app.add_option("--activation", activation, "swiglu or gelu")->capture_default_str(),
      app.add_flag("--renormalize", renormalize, "divide the k chosen weights by their sum (plus --renormalize-epsilon)"),
      app.add_option("--score-function", score_function, "router scores: softmax, sigmoid, sqrt-softplus or logits")->capture_default_str(),
      app.add_option("--expert-groups", expert_groups, "group-limited routing: experts in this many equal groups (1 = none)")->capture_default_str(),
      app.add_option("--top-groups", top_groups, "group-limited routing: the experts of this many best groups may be chosen")->capture_default_str(),
      app.add_option("--router-weights", router_weights, "the chosen experts' weights: scores or softmax-of-selected")->capture_default_str(),
      app.add_option("--renormalize-epsilon", renormalize_epsilon, "added to the weights' sum when renormalising")->capture_default_str(),
      app.add_option("--routed-scaling", routed_scaling, "every routed weight is multiplied by this last")->capture_default_str(),
      app.add_flag("--scale-expert-input", scale_expert_input,
                   "a slot's weight scales the expert's input (x * w in the storage dtype) and its output counts once, as Llama-4's"),
      app.add_option("--router-logits-dtype", router_logits_dtype,
                     "when the logits come from the weights file's gate: the dtype they are rounded to, bf16 or fp32 (default: --dtype)")};
  app.add_option("--capacity-factor", capacity_factor, "0 = dropless; else per-expert capacity factor (see README)")->capture_default_str();
  dtype_option = app.add_option("--dtype", dtype, "storage dtype: bf16 or fp32 (accumulation is always fp32; with --model: the model's)")->capture_default_str();
  routing_option = app.add_option("--routing", routing, "synthetic routing: balanced, skewed or one-expert")->capture_default_str();
  app.add_option("--seed", seed, "seed of the synthetic inputs, logits and weights")->capture_default_str()->check(kNotNegative);
  app.add_option("--inputs", inputs_path, "safetensors file with 'input' [T, hidden] and 'router_logits' [T, E]");
  app.add_option("--weights", weights_path, "safetensors file with experts.{e}.w1/w2/w3.weight or gate_proj/down_proj/up_proj (Hugging Face names)");
  app.add_option("--model", model_path,
                 "a Hugging Face model directory (config.json and safetensors shards) of Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3, "
                 "GPT-OSS or Llama-4 (text): "
                 "the layer, its router, experts and shared expert come from it (with --layer)");
  app.add_option("--layer", model_layer, "with --model: the index of the MoE layer to run");
  app.add_option("--tile-m", plan.tile_m, "GEMM tile rows")->capture_default_str();
  app.add_option("--tile-n", plan.tile_n, "GEMM tile columns")->capture_default_str();
  app.add_option("--compute-workers", plan.compute_workers, "compute workers per rank")->capture_default_str();
  app.add_option("--comm-workers", plan.comm_workers, "communication workers per rank")->capture_default_str();
  app.add_option("--mgb", plan.tile_signal.bands_per_segment, "tile_signal: row bands merged per middle segment (0 = the strategy's choice)")->capture_default_str();
  app.add_option("--comet-split", plan.comet.split_cols, "comet: hidden columns per layer-1 split (0 = hidden/4)")->capture_default_str();
  app.add_option("--comet-dispatch-ctas", plan.comet.dispatch_ctas,
                 "comet on cuda: CTAs of the dispatch beside GEMM0 (one sends, the others place; 0 = the cost model's)")
      ->capture_default_str()
      ->check(kNotNegative);
  app.add_option("--comet-send-ctas", plan.comet.send_ctas, "comet on cuda: CTAs of the splits' sends beside GEMM1 (0 = the cost model's)")
      ->capture_default_str()
      ->check(kNotNegative);
  app.add_option("--combine-tokens", plan.combine_tokens, "tokens per combine task")->capture_default_str();
  dispatch_volume_option =
      app.add_option_function<std::string>(
             "--dispatch-volume", [this](const std::string& name) { plan.dispatch = parse_dispatch_volume(name); },
             "the dispatch: once-per-rank (a row per token and destination rank, placed there for each of its experts, as DeepEP) "
             "or row-per-expert (a row per token and chosen expert); --backend cuda's default: once-per-rank on the device "
             "dispatch, row-per-expert on the host's")
          ->default_str(std::string(dispatch_volume_name(plan.dispatch)));
  app.add_option("--max-memory", max_memory,
                 "refuse a step whose estimated host memory exceeds this (e.g. 8G; default: what the machine has available)");
}

namespace {

// "128,0,7,64": one non-negative count per rank, every entry present.
std::vector<std::int64_t> parse_token_counts(const std::string& text) {
  const std::string usage = "--tokens-per-rank '" + text + "'";
  std::vector<std::int64_t> counts;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    std::string entry = text.substr(begin, end - begin);
    entry.erase(0, entry.find_first_not_of(" \t"));
    entry.erase(entry.find_last_not_of(" \t") + 1);
    if (entry.empty()) throw_bad_input(usage + " has an empty entry: give one count per rank, e.g. 128,0,7,64");
    std::size_t used = 0;
    long long count = -1;
    try {
      count = std::stoll(entry, &used, 10);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != entry.size() || entry[0] == '+') {
      throw_bad_input(usage + ": '" + entry + "' is not a token count; give one count per rank, e.g. 128,0,7,64");
    }
    if (count < 0) throw_bad_input(usage + ": " + entry + " tokens is negative: use 0 or more");
    counts.push_back(count);
    if (end == text.size()) break;
    begin = end + 1;
  }
  return counts;
}

// A layer dimension that a file also gives: an explicit option must agree with the file, and so
// must a file read earlier (`set_by` names it, empty while none has); otherwise the file sets it.
// Without the second check the weights' hidden size silently won over the inputs', and the
// references read the inputs past their rows.
void take_from_file(CLI::Option* option, std::int64_t& value, std::string& set_by, std::int64_t from_file, const char* what,
                    const std::string& file) {
  if (option->count() > 0 && value != from_file) {
    throw_bad_input("--" + std::string(what) + " " + std::to_string(value) + " disagrees with " + file + " (" +
                    std::to_string(from_file) + "); drop the option or fix the file");
  }
  if (!set_by.empty() && value != from_file) {
    throw_bad_input(set_by + " has " + what + " " + std::to_string(value) + " but " + file + " has " + std::to_string(from_file) +
                    ": --inputs and --weights must describe the same layer; fix one of the files");
  }
  value = from_file;
  set_by = file;
}

// --model gives the layer: the options that would describe it too are refused, not overridden.
void check_model_options(const StepOptions& o) {
  if (o.model_layer < 0) throw_bad_input("--model " + o.model_path + ": give --layer N, the index of the MoE layer to run");
  if (!o.weights_path.empty()) throw_bad_input("--weights and --model both give the layer's weights: give one");
  if (o.routing_option != nullptr && o.routing_option->count() > 0) {
    throw_bad_input("--routing draws synthetic logits, but a --model routes by its own gate: drop --routing");
  }
  for (const CLI::Option* option : o.layer_options) {
    if (option != nullptr && option->count() > 0) {
      throw_bad_input(option->get_name() + " describes the layer, which --model's config.json gives: drop " + option->get_name());
    }
  }
}

}  // namespace

EpWorld world_from_options(const StepOptions& o, std::int64_t file_tokens) {
  EpWorld world;
  if (o.ranks < 1) throw_bad_input("--ranks " + std::to_string(o.ranks) + ": use 1 or more");
  if (o.tokens_per_rank_given()) {
    world.tokens_per_rank = parse_token_counts(o.tokens_per_rank_text);
  } else if (file_tokens >= 0) {
    world.tokens_per_rank = split_tokens_evenly(file_tokens, o.ranks);
  } else {
    if (o.tokens < 0) throw_bad_input("--tokens " + std::to_string(o.tokens) + " is negative: use 0 or more");
    world.tokens_per_rank.assign(static_cast<std::size_t>(o.ranks), o.tokens);
  }
  MoeConfig& layer = world.layer;
  layer.hidden = o.hidden;
  layer.ffn_hidden = o.ffn_hidden;
  layer.num_experts = o.experts;
  layer.top_k = o.top_k;
  layer.activation = parse_activation(o.activation);
  layer.renormalize = o.renormalize;
  layer.router.score = parse_score_function(o.score_function);
  layer.router.groups = o.expert_groups;
  layer.router.top_groups = o.top_groups;
  layer.router.weights = parse_router_weights(o.router_weights);
  layer.router.renormalize_epsilon = o.renormalize_epsilon;
  layer.router.scaling = o.routed_scaling;
  layer.router.scales_input = o.scale_expert_input;
  layer.capacity_factor = o.capacity_factor;
  layer.dtype = parse_dtype(o.dtype);
  validate(world);
  validate(o.plan, world);
  return world;
}

namespace {

std::uint64_t file_size_or_zero(const std::string& path) {
  std::error_code error;
  const auto size = path.empty() ? 0 : std::filesystem::file_size(path, error);
  return error ? 0 : static_cast<std::uint64_t>(size);
}

// The step's memory limit and where it comes from, for the message.
struct MemoryLimit {
  std::uint64_t bytes = 0;  // 0: none known
  std::string source;
};

MemoryLimit memory_limit(const StepOptions& o) {
  if (!o.max_memory.empty()) return {parse_memory_size(o.max_memory, "--max-memory"), "--max-memory"};
  return {available_memory_bytes(), "the memory available on this machine"};
}

}  // namespace

std::optional<DispatchVolume> given_dispatch_volume(const StepOptions& options) {
  if (options.dispatch_volume_option == nullptr || options.dispatch_volume_option->count() == 0) return std::nullopt;
  return options.plan.dispatch;
}

PreparedStep prepare_step(const StepOptions& options, const WorldCheck& check_world) {
  StepOptions o = options;
  PreparedStep step;
  StepInputs loaded;
  // Checked before anything large exists: files first (they are read whole), then the data
  // the world implies, then, once the routing is known, the executor's buffers.
  const MemoryLimit limit = memory_limit(o);
  const std::uint64_t file_bytes = file_size_or_zero(o.inputs_path) + file_size_or_zero(o.weights_path);
  if (limit.bytes != 0 && file_bytes > limit.bytes) {
    throw_bad_input("--inputs and --weights hold " + memory_text(file_bytes) + ", more than " + limit.source + " (" +
                    memory_text(limit.bytes) + "): they cannot be read");
  }
  std::string hidden_from, ffn_from, experts_from;  // the file that set each dimension, if one did
  // --model: the layer is the one config.json describes; the tensors are read once it fits
  std::optional<ModelDirectory> model;
  std::optional<ModelLayer> model_layer;
  if (!o.model_path.empty()) {
    check_model_options(o);
    model.emplace(ModelDirectory::open(o.model_path));
    model_layer = model->layer(o.model_layer, o.dtype_option != nullptr && o.dtype_option->count() > 0
                                                  ? std::optional<DType>(parse_dtype(o.dtype))
                                                  : std::nullopt);
    const MoeConfig& m = model_layer->layer;
    o.hidden = m.hidden;
    o.ffn_hidden = m.ffn_hidden;
    o.experts = m.num_experts;
    o.top_k = m.top_k;
    o.dtype = dtype_name(m.dtype);
    hidden_from = ffn_from = experts_from = o.model_path + "'s config.json";
  } else if (o.model_layer >= 0) {
    throw_bad_input("--layer " + std::to_string(o.model_layer) + " chooses a layer of a --model directory: give --model too");
  }
  if (!o.inputs_path.empty()) {
    loaded = load_step_inputs(o.inputs_path, parse_dtype(o.dtype));
    take_from_file(o.hidden_option, o.hidden, hidden_from, loaded.input.cols, "hidden", o.inputs_path);
    if (loaded.experts > 0) take_from_file(o.experts_option, o.experts, experts_from, loaded.experts, "experts", o.inputs_path);
  }
  if (!o.weights_path.empty()) {
    const WeightsShape shape = inspect_weights(o.weights_path);
    take_from_file(o.hidden_option, o.hidden, hidden_from, shape.hidden, "hidden", o.weights_path);
    take_from_file(o.ffn_option, o.ffn_hidden, ffn_from, shape.ffn_hidden, "ffn-hidden", o.weights_path);
    take_from_file(o.experts_option, o.experts, experts_from, shape.num_experts, "experts", o.weights_path);
  }
  step.world = world_from_options(o, o.inputs_path.empty() ? -1 : loaded.input.rows);
  if (model_layer) step.world.layer = model_layer->layer;  // its routing rule too, which no option gives here
  const MoeConfig& layer = step.world.layer;
  if (check_world) check_world(step.world, model_layer ? model_layer->shared_ffn_hidden : 0);
  StepMemoryInputs memory{&step.world, nullptr, o.strategies, file_bytes, !o.plans_only, o.cpu_engine && !o.plans_only};
  memory.expert_weights = !o.plans_only || model_layer.has_value();
  if (model_layer) {
    memory.shared_ffn_hidden = model_layer->shared_ffn_hidden;
    memory.expert_biases = model_layer->interleaved_experts;
  }
  check_step_memory(estimate_step_memory(memory), limit.bytes, limit.source);

  // the router's tensors (and a model's experts), read once for the logits and the routing below
  ModelLayerWeights model_weights;
  if (model) model_weights = model->load(*model_layer);
  RouterTensors router = model ? std::move(model_weights.router)
                         : o.weights_path.empty() ? RouterTensors{}
                                                  : load_router_tensors(o.weights_path, layer.num_experts, layer.hidden, layer.dtype);
  // the dtype of the gate's stored values: the GPU's router holds a bf16 gate without a bias, so
  // it is handed one only when that is exact; otherwise the GPU takes the logits computed here
  const DType gate_dtype = model ? model_layer->gate_dtype : layer.dtype;
  const DType logits_dtype = model ? model_layer->router_logits_dtype
                             : o.router_logits_dtype.empty() ? layer.dtype
                                                             : parse_dtype(o.router_logits_dtype);
  const auto hand_gate_to_gpu = [&] {
    if (gate_dtype != DType::BF16 || !router.gate_bias.empty()) return;  // the GPU's projection has no bias
    step.router_gate = router.gate;
    step.router_logits_dtype = logits_dtype;
  };
  std::vector<std::vector<float>> logits;
  if (!o.inputs_path.empty()) {
    ProgressBar bar("splitting inputs");
    step.inputs = split_by_rank(loaded.input, step.world.tokens_per_rank);
    step.source = "inputs from " + o.inputs_path;
    if (loaded.logits.empty()) {  // the router's gate computes them
      if (router.gate.empty()) {
        throw_bad_input(o.inputs_path + " has no 'router_logits' and " +
                        (o.weights_path.empty() ? std::string("no --weights file gives") : o.weights_path + " has no") +
                        " the router's '<prefix>gate.weight': give one of them");
      }
      loaded.logits = router_logits(loaded.input, router.gate, layer.num_experts, logits_dtype, router.gate_bias);
      step.source += ", logits from the gate of " + (model ? o.model_path : o.weights_path) + " (" + std::string(dtype_name(logits_dtype)) + ")";
      hand_gate_to_gpu();
    }
    logits = split_logits_by_rank(loaded.logits, layer.num_experts, step.world.tokens_per_rank);
  } else {
    ProgressBar bar("drawing inputs");
    SyntheticStep synthetic = synthetic_step(step.world, parse_routing_pattern(o.routing), o.seed);
    step.inputs = std::move(synthetic.inputs);
    if (model) {  // a model routes by its own gate, whatever --routing says
      for (const Matrix& rank_inputs : step.inputs) logits.push_back(router_logits(rank_inputs, router.gate, layer.num_experts, logits_dtype, router.gate_bias));
      step.source = "synthetic inputs, seed " + std::to_string(o.seed) + ", logits from the gate of " + o.model_path;
      hand_gate_to_gpu();
    } else {
      logits = std::move(synthetic.logits);
      step.source = "synthetic " + o.routing + " routing, seed " + std::to_string(o.seed);
    }
  }
  {
    ProgressBar bar("routing");
    step.selection_bias = std::move(router.selection_bias);
    step.routing = route_world(step.world, logits, step.selection_bias);
  }
  step.logits = std::move(logits);
  memory.routing = &step.routing;
  check_step_memory(estimate_step_memory(memory), limit.bytes, limit.source);
  if (o.plans_only && !model && o.weights_path.empty()) return step;  // no experts run
  ProgressBar bar(o.weights_path.empty() && !model ? "drawing weights" : "reading weights");
  if (model) {
    step.weights = std::move(model_weights.experts);
    step.source += ", layer " + std::to_string(o.model_layer) + " of " + o.model_path + " (" + model_layer->model_type + ")";
  } else if (!o.weights_path.empty()) {
    step.weights = load_weights(o.weights_path, layer);
    step.source += ", weights from " + o.weights_path;
  } else {
    step.weights = random_weights(layer, o.seed + 1000);
  }
  return step;
}

}  // namespace tilemoe::cli
