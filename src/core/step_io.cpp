#include "tilemoe/step_io.hpp"

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "expert_tensor_name.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/safetensors.hpp"

namespace tilemoe {

namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::string quoted(std::string_view name) { return safetensors::printable_name(name); }

const safetensors::TensorInfo& matrix(const safetensors::File& file, const std::string& name) {
  const safetensors::TensorInfo& info = file.get(name);
  if (info.shape.size() != 2) {
    throw_bad_input(file.source_name() + ": tensor " + quoted(name) + " has shape " + shape_text(info.shape) + ", expected a matrix");
  }
  return info;
}

// A matrix's values as the layer will hold them (rounded to its storage dtype), refused when
// one is NaN or infinite: such a value poisons every output it reaches the same way in every
// strategy, so the run would fail its checks for a reason that is the file's, not tilemoe's.
std::vector<float> read_finite(const safetensors::File& file, const safetensors::TensorInfo& info, DType dtype) {
  std::vector<float> values = file.read_f32(info);
  const std::int64_t cols = info.shape.size() == 2 ? info.shape[1] : 1;
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

struct ExpertNames {
  std::string prefix;
  std::map<std::int64_t, std::map<std::string, std::string>> by_expert;  // e -> {"w1": name, ...}
};

ExpertNames find_expert_tensors(const safetensors::File& file) {
  ExpertNames names;
  std::set<std::string> prefixes;
  std::vector<std::pair<ExpertTensorName, std::string>> found;  // and the tensor's name
  for (const auto& info : file.tensors()) {
    std::optional<ExpertTensorName> parsed = parse_expert_tensor_name(info.name);
    if (!parsed) continue;
    prefixes.insert(parsed->prefix);
    found.emplace_back(std::move(*parsed), info.name);
  }
  if (prefixes.empty()) {
    throw_bad_input(file.source_name() + ": no expert weights found; expected tensors named like "
                    "'model.layers.0.block_sparse_moe.experts.0.w1.weight'");
  }
  if (prefixes.size() > 1) {
    throw_bad_input(file.source_name() + ": expert weights of " + std::to_string(prefixes.size()) +
                    " layers (e.g. " + quoted(*prefixes.begin()) + " and " + quoted(*prefixes.rbegin()) +
                    "); save one layer's experts per file");
  }
  names.prefix = *prefixes.begin();
  for (const auto& [parsed, name] : found) {
    auto [held, added] = names.by_expert[parsed.expert].emplace(parsed.part, name);
    if (!added) {  // e.g. both "experts.3.w1.weight" and "experts.3.gate_proj.weight"
      throw_bad_input(file.source_name() + ": " + quoted(held->second) + " and " + quoted(name) + " both name expert " +
                      std::to_string(parsed.expert) + "'s " + parsed.part + " matrix; keep one");
    }
  }
  std::int64_t expected = 0;
  for (const auto& [e, parts] : names.by_expert) {
    if (e != expected) throw_bad_input(file.source_name() + ": expert " + std::to_string(expected) + " is missing");
    ++expected;
  }
  return names;
}

}  // namespace

StepInputs load_step_inputs(const std::string& path, DType dtype) {
  const safetensors::File file = safetensors::File::open(path);
  const auto& input = matrix(file, "input");
  StepInputs step;
  const std::vector<float> x = read_finite(file, input, dtype);
  step.input = Matrix::from_floats(dtype, input.shape[0], input.shape[1], x);
  if (file.find("router_logits") == nullptr) return step;  // the router's gate computes them
  const auto& logits = matrix(file, "router_logits");
  if (input.shape[0] != logits.shape[0]) {
    throw_bad_input(path + ": 'input' has " + std::to_string(input.shape[0]) + " tokens but 'router_logits' has " +
                    std::to_string(logits.shape[0]));
  }
  step.experts = logits.shape[1];
  step.logits = file.read_f32(logits);
  return step;
}

WeightsShape inspect_weights(const std::string& path) {
  const safetensors::File file = safetensors::File::open(path);
  const ExpertNames names = find_expert_tensors(file);
  const auto& parts = names.by_expert.begin()->second;
  if (!parts.count("w1") || !parts.count("w2")) throw_bad_input(path + ": expert 0 lacks w1 or w2");
  const auto& w1 = matrix(file, parts.at("w1"));
  return WeightsShape{static_cast<std::int64_t>(names.by_expert.size()), w1.shape[1], w1.shape[0]};
}

ExpertWeights load_weights(const std::string& path, const MoeConfig& config) {
  const safetensors::File file = safetensors::File::open(path);
  const ExpertNames names = find_expert_tensors(file);
  if (static_cast<std::int64_t>(names.by_expert.size()) != config.num_experts) {
    throw_bad_input(path + ": holds " + std::to_string(names.by_expert.size()) + " experts, the layer has " +
                    std::to_string(config.num_experts));
  }
  const bool swiglu = config.activation == Activation::SwiGLU;
  ExpertWeights weights = empty_weights(config);
  for (const auto& expert : names.by_expert) {
    // named copies, not structured bindings: clang before 16 cannot capture those in a lambda
    const std::int64_t e = expert.first;
    const auto& parts = expert.second;
    auto load = [&](const char* which, std::int64_t rows, std::int64_t cols) -> std::vector<float> {
      auto it = parts.find(which);
      if (it == parts.end()) {
        throw_bad_input(path + ": expert " + std::to_string(e) + " has no " + which + " weight" +
                        (std::string(which) == "w3" ? " (SwiGLU needs it; use --activation gelu for a w1/w2 expert)" : ""));
      }
      const auto& info = matrix(file, it->second);
      if (info.shape[0] != rows || info.shape[1] != cols) {
        throw_bad_input(path + ": " + quoted(it->second) + " has shape " + shape_text(info.shape) + ", the layer needs [" +
                        std::to_string(rows) + ", " + std::to_string(cols) + "]");
      }
      return read_finite(file, info, config.dtype);
    };
    const std::vector<float> w1 = load("w1", config.ffn_hidden, config.hidden);
    const std::vector<float> w3 = swiglu ? load("w3", config.ffn_hidden, config.hidden) : std::vector<float>{};
    const std::vector<float> w2 = load("w2", config.hidden, config.ffn_hidden);
    set_expert(weights, e, w1, w3, w2);
  }
  return weights;
}

RouterTensors load_router_tensors(const std::string& path, std::int64_t experts, std::int64_t hidden, DType dtype) {
  const safetensors::File file = safetensors::File::open(path);
  const std::string prefix = find_expert_tensors(file).prefix;
  RouterTensors router;
  const std::string gate = prefix + "gate.weight";
  if (file.find(gate) != nullptr) {
    const auto& info = matrix(file, gate);
    if (info.shape[0] != experts || info.shape[1] != hidden) {
      throw_bad_input(path + ": " + quoted(gate) + " has shape " + shape_text(info.shape) + ", the router needs [experts = " +
                      std::to_string(experts) + ", hidden = " + std::to_string(hidden) + "]");
    }
    router.gate = read_finite(file, info, dtype);
  }
  const std::string bias = prefix + "gate.e_score_correction_bias";
  if (const safetensors::TensorInfo* info = file.find(bias); info != nullptr) {
    if (info->shape.size() != 1 || info->shape[0] != experts) {
      throw_bad_input(path + ": " + quoted(bias) + " has shape " + shape_text(info->shape) + ", the router needs one value per expert: [" +
                      std::to_string(experts) + "]");
    }
    router.selection_bias = file.read_f32(*info);
    for (std::size_t e = 0; e < router.selection_bias.size(); ++e) {
      if (!std::isfinite(router.selection_bias[e])) {
        throw_bad_input(path + ": " + quoted(bias) + " element [" + std::to_string(e) + "] is not finite; every value must be");
      }
    }
  }
  return router;
}

std::vector<Matrix> split_by_rank(const Matrix& all, const std::vector<std::int64_t>& tokens_per_rank) {
  std::vector<Matrix> parts;
  std::int64_t row = 0;
  for (std::int64_t tokens : tokens_per_rank) {
    if (tokens < 0 || row + tokens > all.rows) throw_bad_input("the token counts per rank add up to more than the " + std::to_string(all.rows) + " input tokens");
    Matrix part(all.dtype, tokens, all.cols);
    if (tokens > 0) std::copy(all.row(row), all.row(row) + part.data.size(), part.data.begin());
    parts.push_back(std::move(part));
    row += tokens;
  }
  if (row != all.rows) {
    throw_bad_input("the token counts per rank add up to " + std::to_string(row) + ", the inputs hold " + std::to_string(all.rows) + " tokens");
  }
  return parts;
}

std::vector<std::vector<float>> split_logits_by_rank(const std::vector<float>& logits, std::int64_t experts,
                                                     const std::vector<std::int64_t>& tokens_per_rank) {
  std::vector<std::vector<float>> parts;
  std::size_t at = 0;
  for (std::int64_t tokens : tokens_per_rank) {
    const auto n = static_cast<std::size_t>(tokens * experts);
    if (at + n > logits.size()) throw_bad_input("the router logits hold fewer tokens than the ranks need");
    parts.emplace_back(logits.begin() + static_cast<std::ptrdiff_t>(at), logits.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
  return parts;
}

void write_step_output(const std::string& path, const std::vector<Matrix>& outputs) { stage_step_output(path, outputs).commit(); }

StagedFile stage_step_output(const std::string& path, const std::vector<Matrix>& outputs) {
  if (outputs.empty()) throw_internal("no outputs to write");
  std::int64_t rows = 0;
  for (const Matrix& m : outputs) rows += m.rows;
  Matrix all(outputs[0].dtype, rows, outputs[0].cols);
  std::size_t at = 0;
  for (const Matrix& m : outputs) {
    std::copy(m.data.begin(), m.data.end(), all.data.begin() + static_cast<std::ptrdiff_t>(at));
    at += m.data.size();
  }
  const auto type = all.dtype == DType::F32 ? safetensors::ElementType::F32 : safetensors::ElementType::BF16;
  return safetensors::stage(path, {{"output", type, {all.rows, all.cols}, all.data}});
}

}  // namespace tilemoe
