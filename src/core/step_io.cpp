#include "tilemoe/step_io.hpp"

#include <map>
#include <regex>
#include <set>
#include <string>

#include "tilemoe/error.hpp"
#include "tilemoe/safetensors.hpp"

namespace tilemoe {

namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

const safetensors::TensorInfo& matrix(const safetensors::File& file, const std::string& name) {
  const safetensors::TensorInfo& info = file.get(name);
  if (info.shape.size() != 2) {
    throw_bad_input(file.source_name() + ": tensor '" + name + "' has shape " + shape_text(info.shape) + ", expected a matrix");
  }
  return info;
}

struct ExpertNames {
  std::string prefix;
  std::map<std::int64_t, std::map<std::string, std::string>> by_expert;  // e -> {"w1": name, ...}
};

ExpertNames find_expert_tensors(const safetensors::File& file) {
  static const std::regex pattern(R"(^(.*)experts\.(\d+)\.(w1|w2|w3)\.weight$)");
  ExpertNames names;
  std::set<std::string> prefixes;
  for (const auto& info : file.tensors()) {
    std::smatch m;
    if (!std::regex_match(info.name, m, pattern)) continue;
    prefixes.insert(m[1].str());
    const std::int64_t e = std::stoll(m[2].str().substr(0, 9));
    names.by_expert[e][m[3].str()] = info.name;
  }
  if (prefixes.empty()) {
    throw_bad_input(file.source_name() + ": no expert weights found; expected tensors named like "
                    "'model.layers.0.block_sparse_moe.experts.0.w1.weight'");
  }
  if (prefixes.size() > 1) {
    throw_bad_input(file.source_name() + ": expert weights of " + std::to_string(prefixes.size()) +
                    " layers (e.g. '" + *prefixes.begin() + "' and '" + *prefixes.rbegin() +
                    "'); save one layer's experts per file");
  }
  names.prefix = *prefixes.begin();
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
  const auto& logits = matrix(file, "router_logits");
  if (input.shape[0] != logits.shape[0]) {
    throw_bad_input(path + ": 'input' has " + std::to_string(input.shape[0]) + " tokens but 'router_logits' has " +
                    std::to_string(logits.shape[0]));
  }
  StepInputs step;
  step.experts = logits.shape[1];
  const std::vector<float> x = file.read_f32(input);
  step.input = Matrix::from_floats(dtype, input.shape[0], input.shape[1], x);
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
  for (const auto& [e, parts] : names.by_expert) {
    auto load = [&](const char* which, std::int64_t rows, std::int64_t cols) -> std::vector<float> {
      auto it = parts.find(which);
      if (it == parts.end()) {
        throw_bad_input(path + ": expert " + std::to_string(e) + " has no " + which + " weight" +
                        (std::string(which) == "w3" ? " (SwiGLU needs it; use --activation gelu for a w1/w2 expert)" : ""));
      }
      const auto& info = matrix(file, it->second);
      if (info.shape[0] != rows || info.shape[1] != cols) {
        throw_bad_input(path + ": '" + it->second + "' has shape " + shape_text(info.shape) + ", the layer needs [" +
                        std::to_string(rows) + ", " + std::to_string(cols) + "]");
      }
      return file.read_f32(info);
    };
    const std::vector<float> w1 = load("w1", config.ffn_hidden, config.hidden);
    const std::vector<float> w3 = swiglu ? load("w3", config.ffn_hidden, config.hidden) : std::vector<float>{};
    const std::vector<float> w2 = load("w2", config.hidden, config.ffn_hidden);
    set_expert(weights, e, w1, w3, w2);
  }
  return weights;
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

void write_step_output(const std::string& path, const std::vector<Matrix>& outputs) {
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
  safetensors::write(path, {{"output", type, {all.rows, all.cols}, all.data}});
}

}  // namespace tilemoe
