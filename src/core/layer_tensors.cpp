#include "layer_tensors.hpp"

#include <cmath>
#include <set>
#include <utility>

#include "expert_tensor_name.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe {

namespace {

constexpr std::string_view kFusedGateUp = "experts.gate_up_proj", kFusedDown = "experts.down_proj";

std::string quoted(std::string_view name) { return safetensors::printable_name(name); }

}  // namespace

std::vector<float> read_finite(const safetensors::File& file, const safetensors::TensorInfo& info, DType dtype) {
  std::vector<float> values = file.read_f32(info);
  const std::int64_t cols = info.shape.empty() ? 1 : info.shape.back();
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float stored = round_to(dtype, values[i]);
    if (std::isfinite(stored)) continue;
    const auto row = static_cast<std::int64_t>(i) / cols, col = static_cast<std::int64_t>(i) % cols;
    std::string what = std::isnan(values[i])   ? std::string("NaN")
                       : std::isinf(values[i]) ? std::string("infinite")
                                               : std::to_string(values[i]) + ", beyond the largest " +
                                                     std::string(dtype_name(dtype)) + " (it would become infinite; use --dtype fp32 or scale it down)";
    throw_bad_input(file.source_name() + ": tensor " + quoted(info.name) + " element [" + std::to_string(row) + ", " +
                    std::to_string(col) + "] is " + what + "; every value must be finite");
  }
  return values;
}

LayerTensors::LayerTensors(std::vector<safetensors::File> files, std::string source, std::optional<std::string> prefix,
                           FusedLayout fused_layout)
    : files_(std::move(files)), source_(std::move(source)), fused_layout_(fused_layout) {
  std::set<std::string> prefixes;
  std::vector<std::pair<ExpertTensorName, std::string>> found;  // and the tensor's name
  for (const safetensors::File& file : files_) {
    for (const safetensors::TensorInfo& info : file.tensors()) {
      if (prefix && info.name.compare(0, prefix->size(), *prefix) != 0) continue;
      by_name_.emplace(info.name, Located{&file, &info});
      std::optional<ExpertTensorName> parsed = parse_expert_tensor_name(info.name);
      if (parsed) {
        prefixes.insert(parsed->prefix);
        found.emplace_back(std::move(*parsed), info.name);
      }
      for (std::string_view fused : {kFusedGateUp, kFusedDown}) {
        if (info.name.size() > fused.size() && info.name.ends_with(fused) && info.name[info.name.size() - fused.size() - 1] == '.') {
          prefixes.insert(info.name.substr(0, info.name.size() - fused.size()));
        }
      }
    }
  }
  if (prefix) prefixes = {*prefix};
  if (prefixes.empty()) {
    throw_bad_input(source_ + ": no expert weights found; expected tensors named like "
                    "'model.layers.0.block_sparse_moe.experts.0.w1.weight'");
  }
  if (prefixes.size() > 1) {
    throw_bad_input(source_ + ": expert weights of " + std::to_string(prefixes.size()) + " layers (e.g. " + quoted(*prefixes.begin()) +
                    " and " + quoted(*prefixes.rbegin()) + "); save one layer's experts per file");
  }
  prefix_ = *prefixes.begin();
  fused_ = find(prefix_ + std::string(kFusedGateUp)) != nullptr || find(prefix_ + std::string(kFusedDown)) != nullptr;
  for (const auto& [parsed, name] : found) {
    if (parsed.prefix != prefix_) continue;
    if (fused_) {
      throw_bad_input(source_ + ": " + quoted(name) + " and the fused " + quoted(prefix_ + std::string(kFusedGateUp)) +
                      " both hold expert matrices of one layer; keep one layout");
    }
    auto [held, added] = by_expert_[parsed.expert].emplace(parsed.part, name);
    if (!added) {  // e.g. both "experts.3.w1.weight" and "experts.3.gate_proj.weight"
      throw_bad_input(source_ + ": " + quoted(held->second) + " and " + quoted(name) + " both name expert " + std::to_string(parsed.expert) +
                      "'s " + parsed.part + " matrix; keep one");
    }
  }
  if (!fused_ && by_expert_.empty()) throw_bad_input(source_ + ": no expert weights under " + quoted(prefix_));
  std::int64_t expected = 0;
  for (const auto& [e, parts] : by_expert_) {
    if (e != expected) throw_bad_input(source_ + ": expert " + std::to_string(expected) + " is missing");
    ++expected;
  }
}

const LayerTensors::Located* LayerTensors::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second;
}

const LayerTensors::Located& LayerTensors::get(std::string_view name) const {
  const Located* located = find(name);
  if (located == nullptr) throw_bad_input(source_ + ": has no tensor " + quoted(name));
  return *located;
}

std::vector<float> LayerTensors::read(std::string_view name, const std::vector<std::int64_t>& shape, DType dtype,
                                      std::string_view needed_for) const {
  const Located& at = get(name);
  if (at.info->shape != shape) {
    throw_bad_input(at.file->source_name() + ": " + quoted(name) + " has shape " + safetensors::shape_text(at.info->shape) + ", " +
                    std::string(needed_for) + " needs " + safetensors::shape_text(shape));
  }
  return read_finite(*at.file, *at.info, dtype);
}

WeightsShape LayerTensors::shape() const {
  if (fused_) {
    const safetensors::TensorInfo& gate_up = *get(prefix_ + std::string(kFusedGateUp)).info;
    const bool columns = fused_layout_ != FusedLayout::GateRowsThenUpRows;
    const std::size_t pair_dim = columns ? 2 : 1;
    if (gate_up.shape.size() != 3 || gate_up.shape[pair_dim] % 2 != 0) {
      throw_bad_input(source_ + ": " + quoted(gate_up.name) + " has shape " + safetensors::shape_text(gate_up.shape) + ", expected " +
                      (columns ? "[experts, hidden, 2 x ffn]" : "[experts, 2 x ffn, hidden]"));
    }
    return columns ? WeightsShape{gate_up.shape[0], gate_up.shape[1], gate_up.shape[2] / 2}
                   : WeightsShape{gate_up.shape[0], gate_up.shape[2], gate_up.shape[1] / 2};
  }
  const auto& parts = by_expert_.begin()->second;
  if (!parts.count("w1") || !parts.count("w2")) throw_bad_input(source_ + ": expert 0 lacks w1 or w2");
  const safetensors::TensorInfo& w1 = *get(parts.at("w1")).info;
  if (w1.shape.size() != 2) throw_bad_input(source_ + ": " + quoted(w1.name) + " has shape " + safetensors::shape_text(w1.shape) + ", expected a matrix");
  return WeightsShape{static_cast<std::int64_t>(by_expert_.size()), w1.shape[1], w1.shape[0]};
}

ExpertWeights LayerTensors::experts(const MoeConfig& layer) const {
  const std::int64_t e_count = layer.num_experts, h = layer.hidden, f = layer.ffn_hidden;
  const bool swiglu = layer.activation == Activation::SwiGLU;
  ExpertWeights weights = empty_weights(layer);
  if (fused_) {
    if (!swiglu) throw_bad_input(source_ + ": the fused gate_up_proj layout holds SwiGLU experts; drop --activation gelu");
    if (fused_layout_ != FusedLayout::GateRowsThenUpRows) return column_experts(layer, std::move(weights));
    const std::vector<float> gate_up = read(prefix_ + std::string(kFusedGateUp), {e_count, 2 * f, h}, layer.dtype, "the layer");
    const std::vector<float> down = read(prefix_ + std::string(kFusedDown), {e_count, h, f}, layer.dtype, "the layer");
    const auto matrix = static_cast<std::size_t>(f * h);
    for (std::int64_t e = 0; e < e_count; ++e) {
      const float* gate = gate_up.data() + static_cast<std::size_t>(e) * 2 * matrix;  // rows [0, f): gate; [f, 2f): up
      set_expert(weights, e, {gate, matrix}, {gate + matrix, matrix}, {down.data() + static_cast<std::size_t>(e) * matrix, matrix});
    }
    return weights;
  }
  if (static_cast<std::int64_t>(by_expert_.size()) != e_count) {
    throw_bad_input(source_ + ": holds " + std::to_string(by_expert_.size()) + " experts, the layer has " + std::to_string(e_count));
  }
  for (const auto& expert : by_expert_) {
    // named copies, not structured bindings: clang before 16 cannot capture those in a lambda
    const std::int64_t e = expert.first;
    const auto& parts = expert.second;
    auto load = [&](const char* which, std::int64_t rows, std::int64_t cols) -> std::vector<float> {
      auto it = parts.find(which);
      if (it == parts.end()) {
        throw_bad_input(source_ + ": expert " + std::to_string(e) + " has no " + which + " weight" +
                        (std::string(which) == "w3" ? " (SwiGLU needs it; use --activation gelu for a w1/w2 expert)" : ""));
      }
      return read(it->second, {rows, cols}, layer.dtype, "the layer");
    };
    const std::vector<float> w1 = load("w1", f, h);
    const std::vector<float> w3 = swiglu ? load("w3", f, h) : std::vector<float>{};
    const std::vector<float> w2 = load("w2", h, f);
    set_expert(weights, e, w1, w3, w2);
  }
  return weights;
}

ExpertWeights LayerTensors::column_experts(const MoeConfig& layer, ExpertWeights weights) const {
  const std::int64_t e_count = layer.num_experts, h = layer.hidden, f = layer.ffn_hidden;
  const bool interleaved = fused_layout_ == FusedLayout::InterleavedColumns;  // and with biases; else concatenated, none
  const std::string gate_up_name = prefix_ + std::string(kFusedGateUp), down_name = prefix_ + std::string(kFusedDown);
  const std::vector<float> gate_up = read(gate_up_name, {e_count, h, 2 * f}, layer.dtype, "the layer");
  const std::vector<float> down = read(down_name, {e_count, f, h}, layer.dtype, "the layer");
  const std::vector<float> gate_up_bias = interleaved ? read(gate_up_name + "_bias", {e_count, 2 * f}, layer.dtype, "the layer") : std::vector<float>{};
  const std::vector<float> down_bias = interleaved ? read(down_name + "_bias", {e_count, h}, layer.dtype, "the layer") : std::vector<float>{};
  const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  // gate o's and up o's column of [hidden][2 ffn]
  const auto gate_column = [&](std::int64_t o) { return interleaved ? 2 * o : o; };
  const auto up_column = [&](std::int64_t o) { return interleaved ? 2 * o + 1 : f + o; };
  std::vector<float> w1(at(f * h)), w3(at(f * h)), w2(at(h * f)), b1(at(f)), b3(at(f));
  for (std::int64_t e = 0; e < e_count; ++e) {
    const float* pairs = gate_up.data() + at(e * h * 2 * f);
    for (std::int64_t i = 0; i < h; ++i) {
      for (std::int64_t o = 0; o < f; ++o) {
        w1[at(o * h + i)] = pairs[i * 2 * f + gate_column(o)];
        w3[at(o * h + i)] = pairs[i * 2 * f + up_column(o)];
      }
    }
    const float* rows = down.data() + at(e * f * h);  // [ffn][hidden]
    for (std::int64_t i = 0; i < f; ++i) {
      for (std::int64_t o = 0; o < h; ++o) w2[at(o * f + i)] = rows[i * h + o];
    }
    set_expert(weights, e, w1, w3, w2);
    if (!interleaved) continue;
    for (std::int64_t o = 0; o < f; ++o) {
      b1[at(o)] = gate_up_bias[at(e * 2 * f + gate_column(o))];
      b3[at(o)] = gate_up_bias[at(e * 2 * f + up_column(o))];
    }
    set_expert_biases(weights, e, b1, b3, {down_bias.data() + at(e * h), at(h)});
  }
  return weights;
}

RouterTensors LayerTensors::router(std::int64_t experts, std::int64_t hidden, DType gate_dtype, std::string_view module) const {
  RouterTensors router;
  const std::string base = prefix_ + std::string(module);
  const std::string gate = base + "weight";
  if (find(gate) != nullptr) {
    router.gate = read(gate, {experts, hidden}, gate_dtype, "the router [experts, hidden]");
  }
  if (find(base + "bias") != nullptr) router.gate_bias = read(base + "bias", {experts}, gate_dtype, "the router's bias (one value per expert)");
  const std::string bias = base + "e_score_correction_bias";
  if (find(bias) != nullptr) router.selection_bias = read(bias, {experts}, DType::F32, "the router's selection bias (one value per expert)");
  return router;
}

SharedExpert LayerTensors::shared_expert(const MoeConfig& layer, std::int64_t ffn_hidden, std::string_view module,
                                         std::string_view gate_module) const {
  const std::string base = prefix_ + std::string(module);
  const std::vector<float> w1 = read(base + "gate_proj.weight", {ffn_hidden, layer.hidden}, layer.dtype, "the shared expert");
  const std::vector<float> w3 = read(base + "up_proj.weight", {ffn_hidden, layer.hidden}, layer.dtype, "the shared expert");
  const std::vector<float> w2 = read(base + "down_proj.weight", {layer.hidden, ffn_hidden}, layer.dtype, "the shared expert");
  std::vector<float> gate;
  if (!gate_module.empty()) {
    gate = read(prefix_ + std::string(gate_module) + "weight", {1, layer.hidden}, layer.dtype, "the shared expert's gate");
  }
  return make_shared_expert(layer, ffn_hidden, w1, w3, w2, gate);
}

}  // namespace tilemoe
