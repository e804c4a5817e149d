#include "tilemoe/config.hpp"

#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe {

std::string_view activation_name(Activation activation) {
  return activation == Activation::SwiGLU ? "swiglu" : "gelu";
}

Activation parse_activation(std::string_view name) {
  if (name == "swiglu" || name == "SwiGLU") return Activation::SwiGLU;
  if (name == "gelu" || name == "GELU") return Activation::GELU;
  throw_bad_input("unknown activation '" + std::string(name) + "': use swiglu or gelu");
}

std::string_view score_function_name(ScoreFunction function) {
  switch (function) {
    case ScoreFunction::Softmax: return "softmax";
    case ScoreFunction::Sigmoid: return "sigmoid";
    case ScoreFunction::SqrtSoftplus: return "sqrt-softplus";
    case ScoreFunction::Logits: return "logits";
  }
  return "?";
}

ScoreFunction parse_score_function(std::string_view name) {
  for (ScoreFunction f : {ScoreFunction::Softmax, ScoreFunction::Sigmoid, ScoreFunction::SqrtSoftplus, ScoreFunction::Logits}) {
    if (name == score_function_name(f)) return f;
  }
  throw_bad_input("unknown score function '" + std::string(name) + "': use softmax, sigmoid, sqrt-softplus or logits");
}

std::string_view router_weights_name(RouterWeights weights) {
  return weights == RouterWeights::Scores ? "scores" : "softmax-of-selected";
}

RouterWeights parse_router_weights(std::string_view name) {
  if (name == "scores") return RouterWeights::Scores;
  if (name == "softmax-of-selected") return RouterWeights::SoftmaxOfSelected;
  throw_bad_input("unknown router weights '" + std::string(name) + "': use scores or softmax-of-selected");
}

std::int64_t local_expert_count(const MoeConfig& config, const ParallelConfig& parallel) {
  return config.num_experts / parallel.world_size;
}

std::int64_t first_local_expert(const MoeConfig& config, const ParallelConfig& parallel) {
  return parallel.rank * local_expert_count(config, parallel);
}

int owner_of_expert(const MoeConfig& config, int world_size, std::int64_t expert) {
  return static_cast<int>(expert / (config.num_experts / world_size));
}

namespace {

// A factor as a user would write it (std::to_string(1e308) is 309 digits long).
std::string number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

void require_multiple_of_8(const char* field, std::int64_t value) {
  if (value % 8 != 0) {
    const std::int64_t up = (value + 7) / 8 * 8;
    throw_bad_input(std::string(field) + " = " + std::to_string(value) +
                    " is not a multiple of 8 (16-byte rows for bf16 vector loads): use " +
                    std::to_string(up > 8 ? up - 8 : 8) + " or " + std::to_string(up));
  }
}

}  // namespace

void validate(const MoeConfig& config) {
  if (config.tokens < 0) {
    throw_bad_input("tokens = " + std::to_string(config.tokens) + " is negative: use 0 or more");
  }
  if (config.hidden <= 0) {
    throw_bad_input("hidden = " + std::to_string(config.hidden) + " must be positive");
  }
  if (config.ffn_hidden <= 0) {
    throw_bad_input("ffn_hidden = " + std::to_string(config.ffn_hidden) + " must be positive");
  }
  require_multiple_of_8("hidden", config.hidden);
  require_multiple_of_8("ffn_hidden", config.ffn_hidden);
  if (config.num_experts <= 0) {
    throw_bad_input("num_experts = " + std::to_string(config.num_experts) + " must be positive");
  }
  if (config.num_experts > kMaxExperts) {
    throw_bad_input("num_experts = " + std::to_string(config.num_experts) + " is more than " +
                    std::to_string(kMaxExperts) + ": is it a typo?");
  }
  if (config.top_k < 1 || config.top_k > config.num_experts) {
    throw_bad_input("top_k = " + std::to_string(config.top_k) + " is outside [1, num_experts = " +
                    std::to_string(config.num_experts) + "]");
  }
  if (!std::isfinite(config.capacity_factor) || config.capacity_factor < 0.0) {
    throw_bad_input("capacity_factor = " + number_text(config.capacity_factor) +
                    " must be 0 (dropless) or positive");
  }
  // Past num_experts / top_k every expert can take every token, so a larger factor changes
  // nothing; one far past it (1e308) is a typo, refused rather than quietly read as dropless.
  if (config.capacity_factor > kMaxCapacityFactor) {
    throw_bad_input("capacity_factor = " + number_text(config.capacity_factor) + " is more than " +
                    std::to_string(static_cast<int>(kMaxCapacityFactor)) +
                    ": a factor of num_experts / top_k already drops nothing; use 0 for dropless");
  }
  const SwigluVariant& v = config.swiglu;
  if (!v.is_default()) {
    if (config.activation != Activation::SwiGLU) throw_bad_input("a clamped SwiGLU needs the swiglu activation, not gelu");
    if (!std::isfinite(v.limit) || v.limit < 0.0f) throw_bad_input("swiglu limit = " + number_text(v.limit) + " must be 0 (none) or positive");
    if (!std::isfinite(v.alpha) || v.alpha <= 0.0f) throw_bad_input("swiglu alpha = " + number_text(v.alpha) + " must be positive and finite");
    if (!std::isfinite(v.up_offset)) throw_bad_input("swiglu up offset = " + number_text(v.up_offset) + " must be finite");
  }
  const RouterConfig& r = config.router;
  if (r.groups < 1 || config.num_experts % r.groups != 0) {
    throw_bad_input("router groups = " + std::to_string(r.groups) + " must divide num_experts = " +
                    std::to_string(config.num_experts) + " (1 = no groups)");
  }
  if (r.top_groups < 1 || r.top_groups > r.groups) {
    throw_bad_input("router top_groups = " + std::to_string(r.top_groups) + " is outside [1, groups = " + std::to_string(r.groups) + "]");
  }
  const std::int64_t group_size = config.num_experts / r.groups;
  if (r.groups > 1 && group_size < 2) {
    throw_bad_input("router groups of " + std::to_string(group_size) + " expert: a group's score is the sum of its two best "
                    "experts, so each group needs at least 2 (use fewer groups)");
  }
  if (r.groups > 1 && r.top_groups * group_size < config.top_k) {
    throw_bad_input("top_k = " + std::to_string(config.top_k) + " experts cannot come from " + std::to_string(r.top_groups) +
                    " group(s) of " + std::to_string(group_size) + ": raise top_groups");
  }
  if (!std::isfinite(r.renormalize_epsilon) || r.renormalize_epsilon < 0.0f) {
    throw_bad_input("router renormalize_epsilon = " + number_text(r.renormalize_epsilon) + " must be 0 or positive");
  }
  if (!std::isfinite(r.scaling) || r.scaling <= 0.0f) {
    throw_bad_input("router scaling = " + number_text(r.scaling) + " must be positive and finite");
  }
}

void validate(const MoeConfig& config, const ParallelConfig& parallel) {
  validate(config);
  if (parallel.world_size < 1) {
    throw_bad_input("world size = " + std::to_string(parallel.world_size) + " must be at least 1");
  }
  if (parallel.rank < 0 || parallel.rank >= parallel.world_size) {
    throw_bad_input("rank = " + std::to_string(parallel.rank) + " is outside [0, " +
                    std::to_string(parallel.world_size) + ")");
  }
  if (config.num_experts % parallel.world_size != 0) {
    throw_bad_input("num_experts = " + std::to_string(config.num_experts) +
                    " is not divisible by the world size " + std::to_string(parallel.world_size) +
                    ": every rank must own the same number of experts; change one of them");
  }
}

MoeConfig EpWorld::rank_config(int rank) const {
  MoeConfig config = layer;
  config.tokens = tokens_per_rank.at(static_cast<std::size_t>(rank));
  return config;
}

std::int64_t EpWorld::total_tokens() const {
  return std::accumulate(tokens_per_rank.begin(), tokens_per_rank.end(), std::int64_t{0});
}

void validate(const EpWorld& world) {
  if (world.tokens_per_rank.empty()) throw_bad_input("the world has no ranks: use 1 or more");
  for (int rank = 0; rank < world.world_size(); ++rank) {
    if (world.tokens_per_rank[rank] < 0) {
      throw_bad_input("rank " + std::to_string(rank) + " has " +
                      std::to_string(world.tokens_per_rank[rank]) + " tokens: use 0 or more");
    }
  }
  validate(world.rank_config(0), ParallelConfig{world.world_size(), 0});
}

std::vector<std::int64_t> split_tokens_evenly(std::int64_t total, int world_size) {
  if (world_size < 1) throw_bad_input("world size must be at least 1");
  if (total < 0) throw_bad_input("token count " + std::to_string(total) + " is negative");
  std::vector<std::int64_t> counts(static_cast<std::size_t>(world_size), total / world_size);
  for (std::int64_t rank = 0; rank < total % world_size; ++rank) ++counts[rank];
  return counts;
}

}  // namespace tilemoe
