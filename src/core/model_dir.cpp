#include "tilemoe/model_dir.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "layer_tensors.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/safetensors.hpp"
#include "tilemoe/shared_expert.hpp"

namespace tilemoe {

namespace {

using Json = nlohmann::json;

constexpr const char* kFamilies = "mixtral, qwen2_moe, qwen3_moe, deepseek_v3, gpt_oss, llama4_text, llama4";

// Llama-4 as released (model_type "llama4", Llama4ForConditionalGeneration) wraps its text model:
// the text config under "text_config", the text model's tensors under "language_model.".
bool is_multimodal_llama4(const std::string& model_type) { return model_type == "llama4"; }
const Json& text_config_of(const Json& config, const std::string& model_type, const std::string& file) {
  if (!is_multimodal_llama4(model_type)) return config;
  if (!config.contains("text_config") || !config.at("text_config").is_object()) {
    throw_bad_input(file + ": model_type \"llama4\" without a \"text_config\" object");
  }
  return config.at("text_config");
}
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

// Index and config files are small; past this a file is not what it claims to be.
constexpr std::uintmax_t kMaxJsonBytes = 64ull << 20;

std::string read_text(const std::filesystem::path& path) {
  std::error_code error;
  const std::uintmax_t size = std::filesystem::file_size(path, error);
  if (error) throw_bad_input(path.string() + ": cannot read: " + error.message());
  if (size > kMaxJsonBytes) throw_bad_input(path.string() + ": " + std::to_string(size) + " bytes, too large for a JSON file of a model");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) throw_bad_input(path.string() + ": cannot read");
  return text.str();
}

Json parse_json_file(const std::filesystem::path& path, const std::string& text) {
  Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) throw_bad_input(path.string() + ": is not a JSON object");
  return json;
}

// A config.json field; `what` names the file for messages.
class ConfigFields {
 public:
  ConfigFields(const Json& json, std::string file) : json_(json), file_(std::move(file)) {}

  bool has(const char* key) const { return json_.contains(key) && !json_.at(key).is_null(); }

  // The first of `keys` present: checkpoints of one family spell a field differently across
  // transformers versions (Qwen3-MoE's "num_experts" is "num_local_experts" in 5.x's own saves).
  std::int64_t positive_of(std::initializer_list<const char*> keys) const {
    for (const char* key : keys) {
      if (has(key)) return positive(key);
    }
    std::string names;
    for (const char* key : keys) names += (names.empty() ? "\"" : " nor \"") + std::string(key) + "\"";
    throw_bad_input(file_ + ": has neither " + names);
  }
  std::int64_t positive(const char* key) const {
    const Json& value = required(key);
    if (!value.is_number_integer() || value.get<std::int64_t>() <= 0) fail(key, "a positive integer", value);
    return value.get<std::int64_t>();
  }
  std::int64_t non_negative(const char* key, std::int64_t fallback) const {
    if (!has(key)) return fallback;
    const Json& value = json_.at(key);
    if (!value.is_number_integer() || value.get<std::int64_t>() < 0) fail(key, "an integer of 0 or more", value);
    return value.get<std::int64_t>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const Json& value = json_.at(key);
    if (!value.is_boolean()) fail(key, "true or false", value);
    return value.get<bool>();
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const Json& value = json_.at(key);
    if (!value.is_number()) fail(key, "a number", value);
    return value.get<double>();
  }
  std::string text(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const Json& value = json_.at(key);
    if (!value.is_string()) fail(key, "a string", value);
    return value.get<std::string>();
  }
  std::vector<std::int64_t> integers(const char* key) const {
    std::vector<std::int64_t> out;
    if (!has(key)) return out;
    const Json& value = json_.at(key);
    if (!value.is_array()) fail(key, "a list of layer indices", value);
    for (const Json& item : value) {
      if (!item.is_number_integer()) fail(key, "a list of layer indices", value);
      out.push_back(item.get<std::int64_t>());
    }
    return out;
  }

 private:
  const Json& required(const char* key) const {
    if (!has(key)) throw_bad_input(file_ + ": has no \"" + std::string(key) + "\"");
    return json_.at(key);
  }
  [[noreturn]] void fail(const char* key, const char* expected, const Json& value) const {
    std::string shown = value.dump();
    if (shown.size() > 60) shown = shown.substr(0, 60) + "...";
    throw_bad_input(file_ + ": \"" + std::string(key) + "\" is " + shown + ", expected " + expected);
  }

  const Json& json_;
  std::string file_;
};

DType model_dtype(const ConfigFields& config, const std::string& file) {
  // transformers 5 writes "dtype", 4.x "torch_dtype"
  const std::string name = config.text("dtype", config.text("torch_dtype", "bfloat16"));
  if (name == "bfloat16") return DType::BF16;
  if (name == "float32") return DType::F32;
  throw_bad_input(file + ": the model's dtype is " + name + "; tilemoe's layers hold bfloat16 or float32: pass --dtype bf16 or fp32");
}

// A shard's name from the index: a file of the directory, nothing that leads out of it.
std::string checked_shard_name(const std::string& name, const std::string& index_file) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    throw_bad_input(index_file + ": shard \"" + safetensors::printable_name(name) + "\" is not a file name of the model's directory");
  }
  return name;
}

}  // namespace

ModelDirectory ModelDirectory::open(const std::string& path) {
  const std::filesystem::path dir(path);
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) throw_bad_input(path + ": is not a directory (--model takes a model's directory)");
  ModelDirectory model;
  model.path_ = path;
  const std::filesystem::path config_path = dir / "config.json";
  if (!std::filesystem::exists(config_path, error)) throw_bad_input(path + ": has no config.json; is it a Hugging Face model directory?");
  model.config_text_ = read_text(config_path);
  const Json config = parse_json_file(config_path, model.config_text_);
  const ConfigFields fields(config, config_path.string());
  model.model_type_ = fields.text("model_type", "");
  if (model.model_type_ != "mixtral" && model.model_type_ != "qwen2_moe" && model.model_type_ != "qwen3_moe" &&
      model.model_type_ != "deepseek_v3" && model.model_type_ != "gpt_oss" && model.model_type_ != "llama4_text" &&
      !is_multimodal_llama4(model.model_type_)) {
    throw_bad_input(config_path.string() + ": model_type \"" + model.model_type_ + "\" is not one tilemoe reads (" + kFamilies + ")");
  }
  model.layer_count_ = ConfigFields(text_config_of(config, model.model_type_, config_path.string()), config_path.string()).positive("num_hidden_layers");

  const std::filesystem::path index_path = dir / kIndexName;
  if (std::filesystem::exists(index_path, error)) {
    const Json index = parse_json_file(index_path, read_text(index_path));
    if (!index.contains("weight_map") || !index.at("weight_map").is_object()) {
      throw_bad_input(index_path.string() + ": has no \"weight_map\" object");
    }
    for (const auto& [tensor, shard] : index.at("weight_map").items()) {
      if (!shard.is_string()) throw_bad_input(index_path.string() + ": the shard of \"" + tensor + "\" is not a file name");
      model.shard_of_.emplace(tensor, (dir / checked_shard_name(shard.get<std::string>(), index_path.string())).string());
    }
  } else if (!std::filesystem::exists(dir / kSingleName, error)) {
    throw_bad_input(path + ": has neither " + kIndexName + " nor " + kSingleName);
  }
  return model;
}

ModelLayer ModelDirectory::layer(std::int64_t index, std::optional<DType> dtype) const {
  const std::string file = (std::filesystem::path(path_) / "config.json").string();
  const Json config = parse_json_file(file, config_text_);
  const bool multimodal = is_multimodal_llama4(model_type_);
  const ConfigFields c(text_config_of(config, model_type_, file), file), outer(config, file);
  if (index < 0 || index >= layer_count_) {
    throw_bad_input("--layer " + std::to_string(index) + ": " + path_ + " has layers 0 to " + std::to_string(layer_count_ - 1));
  }
  ModelLayer out;
  out.model_type = model_type_;
  out.index = index;
  MoeConfig& layer = out.layer;
  layer.hidden = c.positive("hidden_size");
  layer.top_k = c.positive("num_experts_per_tok");
  layer.dtype = dtype.value_or(model_dtype(c.has("dtype") || c.has("torch_dtype") ? c : outer, file));
  if (const std::string act = c.text("hidden_act", "silu"); act != "silu") {
    throw_bad_input(file + ": hidden_act \"" + act + "\": tilemoe's experts are SwiGLU with silu");
  }
  layer.activation = Activation::SwiGLU;
  out.gate_dtype = layer.dtype;
  out.router_logits_dtype = layer.dtype;
  const std::string layer_text = std::string(multimodal ? "language_model." : "") + "model.layers." + std::to_string(index) + ".";
  std::function<bool(std::int64_t)> is_moe;
  if (model_type_ == "mixtral") {
    out.prefix = layer_text + "block_sparse_moe.";
    layer.num_experts = c.positive("num_local_experts");
    layer.ffn_hidden = c.positive("intermediate_size");
    layer.renormalize = true;
    is_moe = [](std::int64_t) { return true; };
  } else if (model_type_ == "qwen2_moe" || model_type_ == "qwen3_moe") {
    out.prefix = layer_text + "mlp.";
    layer.num_experts = c.positive_of({"num_experts", "num_local_experts"});
    layer.ffn_hidden = c.positive("moe_intermediate_size");
    layer.renormalize = c.boolean("norm_topk_prob", false);
    const std::int64_t step = std::max<std::int64_t>(1, c.non_negative("decoder_sparse_step", 1));
    const std::vector<std::int64_t> dense = c.integers("mlp_only_layers");
    is_moe = [step, dense](std::int64_t n) { return std::find(dense.begin(), dense.end(), n) == dense.end() && (n + 1) % step == 0; };
    if (model_type_ == "qwen2_moe") {
      out.shared_ffn_hidden = c.non_negative("shared_expert_intermediate_size", 0);
      out.shared_gated = out.shared_ffn_hidden > 0;
    }
  } else if (model_type_ == "gpt_oss") {
    out.prefix = layer_text + "mlp.";
    out.router_module = "router.";
    out.interleaved_experts = true;
    layer.num_experts = c.positive("num_local_experts");
    layer.ffn_hidden = c.positive("intermediate_size");
    layer.router.score = ScoreFunction::Logits;
    layer.router.weights = RouterWeights::SoftmaxOfSelected;
    layer.swiglu.limit = static_cast<float>(c.number("swiglu_limit", 7.0));
    layer.swiglu.alpha = static_cast<float>(c.number("swiglu_alpha", 1.702));
    layer.swiglu.up_offset = 1.0f;
    is_moe = [](std::int64_t) { return true; };
  } else if (model_type_ == "llama4_text" || multimodal) {
    // Llama4TextMoe: top-1 of the logits, sigmoid(logit) scales the expert's input; an ungated
    // shared expert as wide as the experts; the MoE layers are config.json's moe_layers
    out.prefix = layer_text + "feed_forward.";
    out.router_module = "router.";
    out.concatenated_experts = true;
    layer.num_experts = c.positive("num_local_experts");
    layer.ffn_hidden = c.positive("intermediate_size");
    layer.router.score = ScoreFunction::Sigmoid;
    layer.router.scales_input = true;
    out.shared_ffn_hidden = layer.ffn_hidden;
    const std::vector<std::int64_t> moe_layers = c.integers("moe_layers");
    is_moe = [moe_layers](std::int64_t n) { return std::find(moe_layers.begin(), moe_layers.end(), n) != moe_layers.end(); };
  } else {  // deepseek_v3
    out.prefix = layer_text + "mlp.";
    layer.num_experts = c.positive_of({"n_routed_experts", "num_local_experts"});
    layer.ffn_hidden = c.positive("moe_intermediate_size");
    layer.renormalize = c.boolean("norm_topk_prob", true);
    layer.router.score = ScoreFunction::Sigmoid;
    layer.router.groups = c.non_negative("n_group", 1);
    layer.router.top_groups = c.non_negative("topk_group", 1);
    layer.router.renormalize_epsilon = 1e-20f;
    layer.router.scaling = static_cast<float>(c.number("routed_scaling_factor", 1.0));
    out.gate_dtype = DType::F32;  // transformers keeps "gate.weight" in fp32 and projects in fp32
    out.router_logits_dtype = DType::F32;
    out.shared_ffn_hidden = layer.ffn_hidden * c.non_negative("n_shared_experts", 0);
    const std::int64_t first_moe = c.non_negative("first_k_dense_replace", 0);
    is_moe = [first_moe](std::int64_t n) { return n >= first_moe; };
  }
  if (!is_moe(index)) {
    std::string moe_layers;
    for (std::int64_t n = 0, named = 0; n < layer_count_ && named < 8; ++n) {
      if (!is_moe(n)) continue;
      moe_layers += (named++ ? ", " : "") + std::to_string(n);
    }
    throw_bad_input("--layer " + std::to_string(index) + ": layer " + std::to_string(index) + " of " + path_ +
                    " is a dense MLP, not a MoE block" + (moe_layers.empty() ? std::string(" (it has none)") : "; its MoE layers include " + moe_layers));
  }
  validate(layer);
  return out;
}

ModelLayerWeights ModelDirectory::load(const ModelLayer& layer) const {
  std::set<std::string> shards;
  if (shard_of_.empty()) {
    shards.insert((std::filesystem::path(path_) / kSingleName).string());
  } else {
    for (const auto& [tensor, shard] : shard_of_) {
      if (tensor.compare(0, layer.prefix.size(), layer.prefix) == 0) shards.insert(shard);
    }
    if (shards.empty()) throw_bad_input(path_ + "/" + kIndexName + ": lists no tensor of layer " + std::to_string(layer.index) + " (" + layer.prefix + ")");
  }
  std::vector<safetensors::File> files;
  for (const std::string& shard : shards) files.push_back(safetensors::File::open_header(shard));
  const LayerTensors tensors(std::move(files), path_, layer.prefix,
                             layer.interleaved_experts    ? FusedLayout::InterleavedColumns
                             : layer.concatenated_experts ? FusedLayout::ConcatenatedColumns
                                                          : FusedLayout::GateRowsThenUpRows);
  const MoeConfig& config = layer.layer;
  const WeightsShape shape = tensors.shape();
  if (shape.num_experts != config.num_experts || shape.hidden != config.hidden || shape.ffn_hidden != config.ffn_hidden) {
    throw_bad_input(path_ + ": layer " + std::to_string(layer.index) + " holds " + std::to_string(shape.num_experts) + " experts of hidden " +
                    std::to_string(shape.hidden) + ", ffn " + std::to_string(shape.ffn_hidden) + ", its config.json says " +
                    std::to_string(config.num_experts) + " of hidden " + std::to_string(config.hidden) + ", ffn " +
                    std::to_string(config.ffn_hidden));
  }
  ModelLayerWeights weights{tensors.experts(config), tensors.router(config.num_experts, config.hidden, layer.gate_dtype, layer.router_module)};
  if (weights.router.gate.empty()) throw_bad_input(path_ + ": layer " + std::to_string(layer.index) + " has no router gate " + layer.prefix + layer.router_module + "weight");
  if (layer.shared_ffn_hidden > 0) {
    // one shared expert is "shared_expert.", DeepSeek's several "shared_experts."
    const bool one = layer.model_type == "qwen2_moe" || layer.model_type == "llama4_text" || is_multimodal_llama4(layer.model_type);
    weights.experts.shared = std::make_shared<const SharedExpert>(tensors.shared_expert(
        config, layer.shared_ffn_hidden, one ? "shared_expert." : "shared_experts.", layer.shared_gated ? "shared_expert_gate." : ""));
  }
  return weights;
}

}  // namespace tilemoe
