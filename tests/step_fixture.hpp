#pragma once
// A complete synthetic step for tests: world, inputs, routing, weights, dense reference.
#include <vector>

#include "tilemoe/config.hpp"
#include "tilemoe/plan.hpp"
#include "tilemoe/reference.hpp"
#include "tilemoe/routing.hpp"
#include "tilemoe/synthetic.hpp"
#include "tilemoe/tensor.hpp"
#include "tilemoe/weights.hpp"

namespace tilemoe::testing {

struct StepCase {
  EpWorld world;
  std::vector<Matrix> inputs;
  std::vector<Routing> routing;
  ExpertWeights weights;
};

inline EpWorld make_world(std::vector<std::int64_t> tokens, std::int64_t hidden, std::int64_t ffn, std::int64_t experts,
                          std::int64_t top_k, DType dtype = DType::BF16) {
  EpWorld world;
  world.tokens_per_rank = std::move(tokens);
  world.layer.hidden = hidden;
  world.layer.ffn_hidden = ffn;
  world.layer.num_experts = experts;
  world.layer.top_k = top_k;
  world.layer.dtype = dtype;
  return world;
}

// A layer of `tokens` tokens for routing tests (its widths do not matter to the router).
inline MoeConfig routing_config(std::int64_t tokens, std::int64_t experts, std::int64_t k) {
  MoeConfig c;
  c.tokens = tokens;
  c.hidden = 8;
  c.ffn_hidden = 8;
  c.num_experts = experts;
  c.top_k = k;
  return c;
}

inline StepCase make_case(const EpWorld& world, RoutingPattern pattern, std::uint64_t seed) {
  StepCase c{world, {}, {}, random_weights(world.layer, seed + 77)};
  SyntheticStep s = synthetic_step(world, pattern, seed);
  c.inputs = std::move(s.inputs);
  c.routing = route_world(world, s.logits);
  return c;
}

}  // namespace tilemoe::testing
