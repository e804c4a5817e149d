#pragma once
// Expert weights, held as the fp32 values of their storage dtype and transposed to [in][out]
// so that a row-times-matrix product walks memory in order. The values are exactly the
// stored ones (bf16 weights are widened, never re-rounded).
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tilemoe/config.hpp"

namespace tilemoe {

struct SharedExpert;  // shared_expert.hpp

struct ExpertWeights {
  std::int64_t num_experts = 0, hidden = 0, ffn_hidden = 0;
  Activation activation = Activation::SwiGLU;
  SwigluVariant swiglu;    // the layer's (config.hpp)
  DType dtype = DType::BF16;
  std::vector<float> w1t;  // [E][hidden][ffn]  gate (SwiGLU) or the only input matrix (GELU)
  std::vector<float> w3t;  // [E][hidden][ffn]  up (SwiGLU only; empty for GELU)
  std::vector<float> w2t;  // [E][ffn][hidden]  down
  // The experts' biases (GPT-OSS), added to each GEMM's fp32 sum before its activation or
  // rounding: [E][ffn] gate, [E][ffn] up, [E][hidden] down; all empty when the experts have none.
  std::vector<float> b1, b3, b2;
  bool has_biases() const { return !b1.empty(); }
  // The layer's shared expert, when it has one (DeepSeek, Qwen2-MoE, Llama-4): every token's
  // output adds it on the token's own rank (shared_expert.hpp). Carried with the routed experts
  // so that every executor and reference that is given the layer's weights computes it.
  std::shared_ptr<const SharedExpert> shared;

  const float* gate(std::int64_t e) const { return w1t.data() + e * hidden * ffn_hidden; }
  const float* up(std::int64_t e) const { return w3t.data() + e * hidden * ffn_hidden; }
  const float* down(std::int64_t e) const { return w2t.data() + e * ffn_hidden * hidden; }
};

// Deterministic random weights of the config's shape, scaled so activations stay O(1).
ExpertWeights random_weights(const MoeConfig& config, std::uint64_t seed);

// Builds from matrices in the Hugging Face layout [out][in]: w1 and w3 [ffn][hidden],
// w2 [hidden][ffn] (w3 ignored and may be empty for GELU). Values are rounded to dtype.
void set_expert(ExpertWeights& weights, std::int64_t expert, std::span<const float> w1,
                std::span<const float> w3, std::span<const float> w2);
// Sets one expert's biases (gate [ffn], up [ffn], down [hidden]), rounded to dtype; the first
// call gives every expert biases (zero until set).
void set_expert_biases(ExpertWeights& weights, std::int64_t expert, std::span<const float> b1,
                       std::span<const float> b3, std::span<const float> b2);
ExpertWeights empty_weights(const MoeConfig& config);

// Bad input naming both shapes when the weights are not of the layer's shape (experts, hidden,
// ffn, activation and its SwiGLU variant); every executor and reference checks its weights so.
void check_weights_match(const ExpertWeights& weights, const MoeConfig& layer);

}  // namespace tilemoe
