#pragma once
// A step's tensors in safetensors files, so that inputs, weights and outputs can be exchanged
// with any other MoE implementation.
//
//  inputs file:  "input" [T, hidden] and "router_logits" [T, experts], T = all ranks' tokens,
//                rank 0's first (F32, BF16 or F16; converted to the layer dtype / fp32); the
//                logits may be left out when the weights file holds the router's gate.
//  weights file: per expert e, "<prefix>experts.<e>.w1.weight" [ffn, hidden] (gate),
//                "...w3.weight" [ffn, hidden] (up; SwiGLU only), "...w2.weight" [hidden, ffn]
//                (down): the Hugging Face Mixtral names, or Qwen-MoE's and DeepSeek's
//                "...gate_proj", "...up_proj", "...down_proj" for w1, w3, w2 (one spelling per
//                matrix); one prefix per file; optionally the
//                router's gate "<prefix>gate.weight" [experts, hidden] and its selection bias
//                "<prefix>gate.e_score_correction_bias" [experts] (DeepSeek-V3's name), F32, BF16
//                or F16.
//  output file:  "output" [T, hidden] in the layer dtype, rank 0's tokens first.
#include <cstdint>
#include <string>
#include <vector>

#include "tilemoe/config.hpp"
#include "tilemoe/staged_file.hpp"
#include "tilemoe/tensor.hpp"
#include "tilemoe/weights.hpp"

namespace tilemoe {

struct StepInputs {
  Matrix input;               // [T, hidden] in the requested dtype
  std::vector<float> logits;  // [T, experts]; empty when the file has none
  std::int64_t experts = 0;   // 0 when the file has no logits
};
StepInputs load_step_inputs(const std::string& path, DType dtype);

// The shape the weights file describes: num_experts, hidden, ffn_hidden.
struct WeightsShape {
  std::int64_t num_experts = 0, hidden = 0, ffn_hidden = 0;
};
WeightsShape inspect_weights(const std::string& path);
// Loads into the config's shape (which must match the file: a bad-input error says how not).
ExpertWeights load_weights(const std::string& path, const MoeConfig& config);
// The router's tensors of a weights file, in one read of it (each empty when the file has none):
// its gate weight ([experts][hidden], rounded to `dtype` as the layer stores weights) and its
// selection bias (one finite value per expert; routing.hpp).
struct RouterTensors {
  std::vector<float> gate;
  std::vector<float> selection_bias;
  std::vector<float> gate_bias;  // the projection's own bias (GPT-OSS's router.bias), added to the logits
};
RouterTensors load_router_tensors(const std::string& path, std::int64_t experts, std::int64_t hidden, DType dtype);

// Rows [offset_r, offset_r + tokens_r) of `all` for each rank.
std::vector<Matrix> split_by_rank(const Matrix& all, const std::vector<std::int64_t>& tokens_per_rank);
std::vector<std::vector<float>> split_logits_by_rank(const std::vector<float>& logits, std::int64_t experts,
                                                     const std::vector<std::int64_t>& tokens_per_rank);

// Writes "output" atomically: nothing is left at `path` if writing fails.
void write_step_output(const std::string& path, const std::vector<Matrix>& outputs);
// The same, written under a temporary name, for the caller to commit() with the step's other files.
StagedFile stage_step_output(const std::string& path, const std::vector<Matrix>& outputs);

}  // namespace tilemoe
