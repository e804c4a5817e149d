#include "tilemoe/routing.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe {

Routing route(const MoeConfig& config, std::span<const float> logits, int rank) {
  validate(config);
  const std::int64_t experts = config.num_experts;
  const std::int64_t k = config.top_k;
  if (static_cast<std::int64_t>(logits.size()) != config.tokens * experts) {
    throw_bad_input("rank " + std::to_string(rank) + ": router logits have " +
                    std::to_string(logits.size()) + " values, expected tokens x experts = " +
                    std::to_string(config.tokens) + " x " + std::to_string(experts));
  }
  Routing routing;
  routing.tokens = config.tokens;
  routing.top_k = k;
  routing.expert.resize(static_cast<std::size_t>(config.tokens * k));
  routing.weight.resize(routing.expert.size());
  routing.kept.assign(routing.expert.size(), 1);

  std::vector<float> probability(static_cast<std::size_t>(experts));
  std::vector<std::int32_t> order(static_cast<std::size_t>(experts));
  for (std::int64_t token = 0; token < config.tokens; ++token) {
    const float* row = logits.data() + token * experts;
    float max_logit = row[0];
    for (std::int64_t e = 0; e < experts; ++e) {
      if (!std::isfinite(row[e])) {
        throw_bad_input("rank " + std::to_string(rank) + ", token " + std::to_string(token) +
                        ": router logit for expert " + std::to_string(e) + " is " +
                        (std::isnan(row[e]) ? "NaN" : "infinite") +
                        "; the router produced invalid values");
      }
      max_logit = std::max(max_logit, row[e]);
    }
    float sum = 0.0f;
    for (std::int64_t e = 0; e < experts; ++e) {
      probability[e] = std::exp(row[e] - max_logit);
      sum += probability[e];
    }
    for (std::int64_t e = 0; e < experts; ++e) probability[e] /= sum;

    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](std::int32_t a, std::int32_t b) {
                        if (probability[a] != probability[b]) return probability[a] > probability[b];
                        return a < b;
                      });
    float selected_sum = 0.0f;
    for (std::int64_t j = 0; j < k; ++j) selected_sum += probability[order[j]];
    for (std::int64_t j = 0; j < k; ++j) {
      const std::size_t s = routing.slot(token, j);
      routing.expert[s] = order[j];
      routing.weight[s] = config.renormalize ? probability[order[j]] / selected_sum
                                             : probability[order[j]];
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

std::vector<Routing> route_world(const EpWorld& world, const std::vector<std::vector<float>>& logits) {
  if (logits.size() != world.tokens_per_rank.size()) {
    throw_bad_input("router logits are given for " + std::to_string(logits.size()) + " ranks, the world has " +
                    std::to_string(world.tokens_per_rank.size()));
  }
  std::vector<Routing> routing;
  for (int rank = 0; rank < world.world_size(); ++rank) {
    routing.push_back(route(world.rank_config(rank), logits[static_cast<std::size_t>(rank)], rank));
  }
  return routing;
}

}  // namespace tilemoe
