#pragma once
// Routing: router logits -> per token the top-k experts and their weights.
//
// Rules every backend follows:
//  - softmax over all E logits in fp32 (subtract the max, exp, sum in expert order, divide);
//  - the k largest probabilities are chosen; equal ones go to the lower expert id; slots are
//    in that order (descending weight, then ascending id): this is the "top-k slot order";
//  - with renormalisation the k weights are divided by their sum (summed in slot order);
//  - with a capacity factor, see apply_capacity below.
#include <cstdint>
#include <span>
#include <vector>

#include "tilemoe/config.hpp"

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

// `logits` is [config.tokens, config.num_experts] row-major. A NaN or infinite logit is a
// bad-input error naming the rank, the token and the expert.
Routing route(const MoeConfig& config, std::span<const float> logits, int rank);

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

// Routes every rank of a world: logits[r] is rank r's [tokens_r, E].
std::vector<Routing> route_world(const EpWorld& world, const std::vector<std::vector<float>>& logits);

}  // namespace tilemoe
