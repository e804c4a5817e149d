#include "tilemoe/synthetic.hpp"

#include <cmath>
#include <random>
#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe {

RoutingPattern parse_routing_pattern(std::string_view name) {
  if (name == "balanced") return RoutingPattern::Balanced;
  if (name == "skewed") return RoutingPattern::Skewed;
  if (name == "one-expert") return RoutingPattern::OneExpert;
  throw_bad_input("unknown routing pattern '" + std::string(name) + "': use balanced, skewed or one-expert");
}

std::string_view routing_pattern_name(RoutingPattern pattern) {
  switch (pattern) {
    case RoutingPattern::Balanced: return "balanced";
    case RoutingPattern::Skewed: return "skewed";
    case RoutingPattern::OneExpert: return "one-expert";
  }
  return "?";
}

SyntheticStep synthetic_step(const EpWorld& world, RoutingPattern pattern, std::uint64_t seed) {
  validate(world);
  const std::int64_t h = world.layer.hidden, experts = world.layer.num_experts;
  SyntheticStep step;
  for (int rank = 0; rank < world.world_size(); ++rank) {
    std::mt19937_64 rng(seed * 0x2545f4914f6cdd1dull + static_cast<std::uint64_t>(rank) + 1);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const std::int64_t tokens = world.tokens_per_rank[static_cast<std::size_t>(rank)];
    std::vector<float> x(static_cast<std::size_t>(tokens * h));
    for (float& v : x) v = uniform(rng);
    step.inputs.push_back(Matrix::from_floats(world.layer.dtype, tokens, h, x));
    std::vector<float> logits(static_cast<std::size_t>(tokens * experts));
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (std::int64_t e = 0; e < experts; ++e) {
        float value = normal(rng);
        if (pattern == RoutingPattern::Skewed) value -= 1.5f * std::log(static_cast<float>(e + 1));
        if (pattern == RoutingPattern::OneExpert && e == 0) value += 100.0f;
        logits[static_cast<std::size_t>(t * experts + e)] = value;
      }
    }
    step.logits.push_back(std::move(logits));
  }
  return step;
}

}  // namespace tilemoe
