#pragma once
// Synthetic steps: random inputs and router logits of a chosen routing pattern, for the CLI's
// default job, the tests and the benchmarks. Never zeros: every value is random.
#include <cstdint>
#include <string_view>
#include <vector>

#include "tilemoe/config.hpp"
#include "tilemoe/tensor.hpp"

namespace tilemoe {

enum class RoutingPattern {
  Balanced,   // logits N(0, 1): experts loaded about evenly
  Skewed,     // a Zipf-like bias: expert 0 hottest, the last coldest
  OneExpert,  // every token's first choice is expert 0
};
RoutingPattern parse_routing_pattern(std::string_view name);  // balanced | skewed | one-expert
std::string_view routing_pattern_name(RoutingPattern pattern);

struct SyntheticStep {
  std::vector<Matrix> inputs;               // per rank, [tokens, hidden] in the layer dtype
  std::vector<std::vector<float>> logits;   // per rank, [tokens, experts]
};
SyntheticStep synthetic_step(const EpWorld& world, RoutingPattern pattern, std::uint64_t seed);

}  // namespace tilemoe
