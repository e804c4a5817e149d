#include "tilemoe/routing.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe {

namespace {

// torch's softplus (beta 1, threshold 20): the input itself past the threshold.
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// A token's scores from its logits, by the router's function.
void score_token(ScoreFunction function, const float* logits, std::int64_t experts, float* scores) {
  switch (function) {
    case ScoreFunction::Softmax: {
      float max_logit = logits[0];
      for (std::int64_t e = 0; e < experts; ++e) max_logit = std::max(max_logit, logits[e]);
      float sum = 0.0f;
      for (std::int64_t e = 0; e < experts; ++e) {
        scores[e] = std::exp(logits[e] - max_logit);
        sum += scores[e];
      }
      for (std::int64_t e = 0; e < experts; ++e) scores[e] /= sum;
      return;
    }
    case ScoreFunction::Sigmoid:
      for (std::int64_t e = 0; e < experts; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
      return;
    case ScoreFunction::SqrtSoftplus:
      for (std::int64_t e = 0; e < experts; ++e) scores[e] = std::sqrt(softplus(logits[e]));
      return;
    case ScoreFunction::Logits:
      std::copy(logits, logits + experts, scores);
      return;
  }
}

// Keeps the experts of the best `top_groups` of `groups` groups: the others' selection scores
// become -inf, so that they are never chosen (transformers 5.x, DeepseekV3TopkRouter.forward, and
// DeepSeek-V3's own inference code mask them so; transformers 4.x masked with 0, which let a
// masked expert beat a kept one whose biased score is negative). validate() keeps top_k within
// the kept groups' experts.
void limit_to_groups(const RouterConfig& r, std::int64_t experts, float* choice, std::vector<float>& group_score,
                     std::vector<std::int32_t>& group_order) {
  const std::int64_t size = experts / r.groups;
  group_score.resize(static_cast<std::size_t>(r.groups));
  group_order.resize(static_cast<std::size_t>(r.groups));
  for (std::int64_t g = 0; g < r.groups; ++g) {
    float best = -INFINITY, second = -INFINITY;
    for (std::int64_t e = g * size; e < (g + 1) * size; ++e) {
      if (choice[e] > best) {
        second = best;
        best = choice[e];
      } else if (choice[e] > second) {
        second = choice[e];
      }
    }
    group_score[static_cast<std::size_t>(g)] = best + second;
  }
  std::iota(group_order.begin(), group_order.end(), 0);
  std::partial_sort(group_order.begin(), group_order.begin() + r.top_groups, group_order.end(), [&](std::int32_t a, std::int32_t b) {
    if (group_score[a] != group_score[b]) return group_score[a] > group_score[b];
    return a < b;
  });
  for (std::int64_t i = r.top_groups; i < r.groups; ++i) {
    const std::int64_t g = group_order[static_cast<std::size_t>(i)];
    std::fill(choice + g * size, choice + (g + 1) * size, -INFINITY);
  }
}

}  // namespace

void check_router_gate(std::span<const float> gate, std::int64_t experts, std::int64_t hidden) {
  if (experts < 1 || static_cast<std::int64_t>(gate.size()) != experts * hidden) {
    throw_bad_input("the router's gate weight has " + std::to_string(gate.size()) + " values, [experts = " + std::to_string(experts) +
                    "] x [hidden = " + std::to_string(hidden) + "] needed");
  }
  for (std::size_t i = 0; i < gate.size(); ++i) {
    if (!std::isfinite(gate[i])) throw_bad_input("the router's gate weight " + std::to_string(i) + " is not finite");
  }
}

namespace {

// empty, or one finite value per expert; `what` names the tensor
void check_per_expert(std::span<const float> values, std::int64_t experts, const char* what) {
  if (!values.empty() && static_cast<std::int64_t>(values.size()) != experts) {
    throw_bad_input(std::string("the router's ") + what + " has " + std::to_string(values.size()) + " values, one per expert is " +
                    std::to_string(experts));
  }
  for (std::size_t e = 0; e < values.size(); ++e) {
    if (!std::isfinite(values[e])) throw_bad_input(std::string("the router's ") + what + " of expert " + std::to_string(e) + " is not finite");
  }
}

}  // namespace

void check_selection_bias(std::span<const float> bias, std::int64_t experts) { check_per_expert(bias, experts, "selection bias"); }

std::vector<float> router_logits(const Matrix& input, std::span<const float> gate, std::int64_t experts, DType logits_dtype,
                                 std::span<const float> gate_bias) {
  check_router_gate(gate, experts, input.cols);
  check_per_expert(gate_bias, experts, "gate bias");
  const std::vector<float> x = input.to_floats();
  std::vector<float> logits(static_cast<std::size_t>(input.rows * experts));
  for (std::int64_t t = 0; t < input.rows; ++t) {
    const float* row = x.data() + t * input.cols;
    for (std::int64_t e = 0; e < experts; ++e) {
      const float* w = gate.data() + e * input.cols;
      float sum = 0.0f;
      for (std::int64_t h = 0; h < input.cols; ++h) sum += row[h] * w[h];
      if (!gate_bias.empty()) sum += gate_bias[static_cast<std::size_t>(e)];
      logits[static_cast<std::size_t>(t * experts + e)] = round_to(logits_dtype, sum);
    }
  }
  return logits;
}

Routing route(const MoeConfig& config, std::span<const float> logits, int rank, std::span<const float> selection_bias) {
  validate(config);
  const std::int64_t experts = config.num_experts;
  const std::int64_t k = config.top_k;
  const RouterConfig& router = config.router;
  if (static_cast<std::int64_t>(logits.size()) != config.tokens * experts) {
    throw_bad_input("rank " + std::to_string(rank) + ": router logits have " +
                    std::to_string(logits.size()) + " values, expected tokens x experts = " +
                    std::to_string(config.tokens) + " x " + std::to_string(experts));
  }
  check_selection_bias(selection_bias, experts);
  Routing routing;
  routing.tokens = config.tokens;
  routing.top_k = k;
  routing.expert.resize(static_cast<std::size_t>(config.tokens * k));
  routing.weight.resize(routing.expert.size());
  routing.kept.assign(routing.expert.size(), 1);

  std::vector<float> score(static_cast<std::size_t>(experts)), choice(static_cast<std::size_t>(experts));
  std::vector<std::int32_t> order(static_cast<std::size_t>(experts));
  std::vector<float> group_score, weight(static_cast<std::size_t>(k));
  std::vector<std::int32_t> group_order;
  for (std::int64_t token = 0; token < config.tokens; ++token) {
    const float* row = logits.data() + token * experts;
    for (std::int64_t e = 0; e < experts; ++e) {
      if (!std::isfinite(row[e])) {
        throw_bad_input("rank " + std::to_string(rank) + ", token " + std::to_string(token) +
                        ": router logit for expert " + std::to_string(e) + " is " +
                        (std::isnan(row[e]) ? "NaN" : "infinite") +
                        "; the router produced invalid values");
      }
    }
    score_token(router.score, row, experts, score.data());
    for (std::int64_t e = 0; e < experts; ++e) {
      choice[e] = selection_bias.empty() ? score[e] : score[e] + selection_bias[static_cast<std::size_t>(e)];
    }
    if (router.groups > 1) limit_to_groups(router, experts, choice.data(), group_score, group_order);

    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](std::int32_t a, std::int32_t b) {
                        if (choice[a] != choice[b]) return choice[a] > choice[b];
                        return a < b;
                      });
    for (std::int64_t j = 0; j < k; ++j) weight[j] = score[order[j]];
    if (router.weights == RouterWeights::SoftmaxOfSelected) {
      const float top = *std::max_element(weight.begin(), weight.end());
      float sum = 0.0f;
      for (float& w : weight) {
        w = std::exp(w - top);
        sum += w;
      }
      for (float& w : weight) w /= sum;
    }
    if (config.renormalize) {
      float selected_sum = 0.0f;
      for (std::int64_t j = 0; j < k; ++j) selected_sum += weight[j];
      const float denominator = selected_sum + router.renormalize_epsilon;
      for (float& w : weight) w /= denominator;
    }
    for (std::int64_t j = 0; j < k; ++j) {
      const std::size_t s = routing.slot(token, j);
      routing.expert[s] = order[j];
      routing.weight[s] = weight[j] * router.scaling;
    }
  }
  apply_capacity(config, routing);
  return routing;
}

std::int64_t expert_capacity(const MoeConfig& config) {
  const double slots = config.capacity_factor * static_cast<double>(config.tokens * config.top_k) /
                       static_cast<double>(config.num_experts);
  // A token picks an expert at most once, so no expert can receive more than `tokens` slots:
  // a larger capacity drops nothing. Clamping before the conversion also keeps a huge factor
  // from overflowing int64 (1e308 became a negative capacity, which dropped every slot).
  if (!(slots < static_cast<double>(config.tokens))) return config.tokens;
  return static_cast<std::int64_t>(std::ceil(slots));
}

void apply_capacity(const MoeConfig& config, Routing& routing) {
  std::fill(routing.kept.begin(), routing.kept.end(), 1);
  if (config.capacity_factor == 0.0) return;
  const std::int64_t capacity = expert_capacity(config);
  std::vector<std::int64_t> used(static_cast<std::size_t>(config.num_experts), 0);
  for (std::int64_t j = 0; j < routing.top_k; ++j) {
    for (std::int64_t token = 0; token < routing.tokens; ++token) {
      const std::size_t s = routing.slot(token, j);
      std::int64_t& count = used[static_cast<std::size_t>(routing.expert[s])];
      if (count < capacity) {
        ++count;
      } else {
        routing.kept[s] = 0;
      }
    }
  }
}

}  // namespace tilemoe

namespace tilemoe {

std::vector<Routing> route_world(const EpWorld& world, const std::vector<std::vector<float>>& logits,
                                 std::span<const float> selection_bias) {
  if (logits.size() != world.tokens_per_rank.size()) {
    throw_bad_input("router logits are given for " + std::to_string(logits.size()) + " ranks, the world has " +
                    std::to_string(world.tokens_per_rank.size()));
  }
  std::vector<Routing> routing;
  for (int rank = 0; rank < world.world_size(); ++rank) {
    routing.push_back(route(world.rank_config(rank), logits[static_cast<std::size_t>(rank)], rank, selection_bias));
  }
  return routing;
}

}  // namespace tilemoe
