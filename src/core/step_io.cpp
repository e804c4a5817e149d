#include "tilemoe/step_io.hpp"

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "layer_tensors.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/safetensors.hpp"

namespace tilemoe {

namespace {

const safetensors::TensorInfo& matrix(const safetensors::File& file, const std::string& name) {
  const safetensors::TensorInfo& info = file.get(name);
  if (info.shape.size() != 2) {
    throw_bad_input(file.source_name() + ": tensor " + safetensors::printable_name(name) + " has shape " + safetensors::shape_text(info.shape) +
                    ", expected a matrix");
  }
  return info;
}

// The one layer a weights file holds, its header read, its tensors on demand.
LayerTensors weights_file(const std::string& path) {
  std::vector<safetensors::File> files;
  files.push_back(safetensors::File::open_header(path));
  return LayerTensors(std::move(files), path, std::nullopt);
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

WeightsShape inspect_weights(const std::string& path) { return weights_file(path).shape(); }

ExpertWeights load_weights(const std::string& path, const MoeConfig& config) { return weights_file(path).experts(config); }

RouterTensors load_router_tensors(const std::string& path, std::int64_t experts, std::int64_t hidden, DType dtype) {
  return weights_file(path).router(experts, hidden, dtype);
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
