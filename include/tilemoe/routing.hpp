#pragma once
// Routing: router logits -> per token the top-k experts and their weights.
//
// Rules every backend follows (MoeConfig::router says which function and options; the defaults
// are Mixtral's, and then this is exactly the rule the CUDA router runs):
//  - scores in fp32: softmax over all E logits (subtract the max, exp, sum in expert order,
//    divide), sigmoid 1 / (1 + exp(-x)), sqrt(softplus(x)) (softplus = x past 20, as torch's,
//    else log1p(exp(x))), or the logits themselves;
//  - selection scores: the scores plus the selection bias, if any (used to choose only);
//  - with groups: a group's score is the sum of its two largest selection scores (the larger
//    first); the top_groups best groups are kept (equal ones: the lower group id), and the
//    other experts' selection scores become -inf (never chosen);
//  - the k largest selection scores are chosen; equal ones go to the lower expert id; slots are
//    in that order (descending selection score, then ascending id): the "top-k slot order";
//  - weights: the chosen experts' scores (unbiased), or a softmax over them (max subtracted,
//    exp, sum in slot order, divide);
//  - with renormalisation the k weights are divided by (their sum in slot order + epsilon);
//  - then multiplied by the router's scaling;
//  - with a capacity factor, see apply_capacity below.
#include <cstdint>
#include <span>
#include <vector>

#include "tilemoe/config.hpp"
#include "tilemoe/tensor.hpp"

namespace tilemoe {

struct Routing {
  std::int64_t tokens = 0;
  std::int64_t top_k = 0;
  std::vector<std::int32_t> expert;  // [tokens * top_k], slot order
  std::vector<float> weight;         // [tokens * top_k]
  std::vector<std::uint8_t> kept;    // [tokens * top_k]; 0 = dropped by the capacity rule

  std::size_t slot(std::int64_t token, std::int64_t j) const {
    return static_cast<std::size_t>(token * top_k + j);
  }
};

// The router's projection: logits[t][e] = sum over h ascending of input[t][h] * gate[e][h] in
// fp32, then rounded to `logits_dtype` (the model's: Mixtral and Qwen compute their gate in the
// model dtype, DeepSeek-V3 in fp32). `gate` is [experts][input.cols] row-major, as Hugging Face
// stores `gate.weight`. `gate_bias`, when given (GPT-OSS's `router.bias`), one value per expert, is
// added to each sum before the rounding.
std::vector<float> router_logits(const Matrix& input, std::span<const float> gate, std::int64_t experts, DType logits_dtype,
                                 std::span<const float> gate_bias = {});

// What every router takes of the model's router tensors, checked alike on every backend (bad
// input otherwise): a gate of experts x hidden finite values; a selection bias empty or of one
// finite value per expert.
void check_router_gate(std::span<const float> gate, std::int64_t experts, std::int64_t hidden);
void check_selection_bias(std::span<const float> bias, std::int64_t experts);

// `logits` is [config.tokens, config.num_experts] row-major. A NaN or infinite logit is a
// bad-input error naming the rank, the token and the expert. `selection_bias`: empty, or one
// finite value per expert added to the scores to choose only (DeepSeek-V3's
// e_score_correction_bias).
Routing route(const MoeConfig& config, std::span<const float> logits, int rank, std::span<const float> selection_bias = {});

// Drop policy for capacity_factor > 0 (local to each rank, so it needs no communication):
// capacity C = ceil(capacity_factor * tokens * top_k / num_experts) per expert. Slots claim
// capacity in priority order: all slot-0 choices first (tokens ascending), then all slot-1
// choices, and so on (the GShard order: a token's first choice outranks anyone's second).
// A slot beyond its expert's capacity is dropped; the kept weights are not renormalised, so a
// dropped slot simply contributes nothing to the token's output.
void apply_capacity(const MoeConfig& config, Routing& routing);

std::int64_t expert_capacity(const MoeConfig& config);

}  // namespace tilemoe

namespace tilemoe {

// Routes every rank of a world: logits[r] is rank r's [tokens_r, E]; one selection bias for all.
std::vector<Routing> route_world(const EpWorld& world, const std::vector<std::vector<float>>& logits,
                                 std::span<const float> selection_bias = {});

}  // namespace tilemoe
