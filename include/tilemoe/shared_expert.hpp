#pragma once
// A MoE layer's shared expert: an expert that every token visits, on the token's own rank and
// without routing, whose output is added to the routed experts' sum (DeepSeek-V3's
// `shared_experts`, Qwen2-MoE's `shared_expert` gated by `sigmoid(shared_expert_gate(x))`,
// Llama-4's `shared_expert`). Several shared experts of one width are stored by the models as
// one of their summed width (DeepSeek: moe_intermediate_size * n_shared_experts), and so here.
//
// The arithmetic, and its rounding points in the layer's dtype (those of the models' modules in
// bf16): the expert's FFN as a routed expert's (the activation stored between the GEMMs, the
// result stored after GEMM1); with a gate, g = x . gate stored, then sigmoid(g) stored, then
// their product with the FFN's result stored; then output = routed output + that, stored.
// Every strategy's routed output is the same bits, so its sum with the shared expert is too.
#include <cstdint>
#include <span>
#include <vector>

#include "tilemoe/config.hpp"
#include "tilemoe/tensor.hpp"
#include "tilemoe/weights.hpp"

namespace tilemoe {

struct SharedExpert {
  ExpertWeights ffn;        // one expert: num_experts 1, ffn_hidden the shared width
  std::vector<float> gate;  // [hidden], the gate's weight row (stored values); empty: ungated
};

// A shared expert of `ffn_hidden` for a layer of `layer`'s width, activation and dtype, from
// matrices in the Hugging Face layout (as set_expert takes them) and a gate row or nothing.
// Bad input when a matrix or the gate has another size or a value is not finite.
SharedExpert make_shared_expert(const MoeConfig& layer, std::int64_t ffn_hidden, std::span<const float> w1,
                                std::span<const float> w3, std::span<const float> w2, std::span<const float> gate);

// output[t] = output[t] + shared(input[t]) for every row, with the rounding points above. The
// matrices are one rank's [tokens, hidden] in the layer's dtype.
void add_shared_expert(const SharedExpert& shared, const Matrix& input, Matrix& output);

// The same in fp64 without intermediate rounding, onto one rank's row-major fp64 output.
void add_shared_expert_fp64(const SharedExpert& shared, const Matrix& input, std::vector<double>& output);

}  // namespace tilemoe
