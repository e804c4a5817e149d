#include "tilemoe/weights.hpp"

#include <cmath>
#include <random>
#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe {

void check_weights_match(const ExpertWeights& weights, const MoeConfig& layer) {
  if (weights.hidden == layer.hidden && weights.ffn_hidden == layer.ffn_hidden && weights.num_experts == layer.num_experts &&
      weights.activation == layer.activation && weights.swiglu == layer.swiglu) {
    return;
  }
  const auto shape = [](std::int64_t experts, std::int64_t hidden, std::int64_t ffn, Activation activation, const SwigluVariant& v) {
    std::string text = std::to_string(experts) + " experts of hidden " + std::to_string(hidden) + ", ffn " + std::to_string(ffn) + ", " +
                       std::string(activation_name(activation));
    if (!v.is_default()) text += " (clamped at " + std::to_string(v.limit) + ")";
    return text;
  };
  throw_bad_input("the expert weights are " + shape(weights.num_experts, weights.hidden, weights.ffn_hidden, weights.activation, weights.swiglu) +
                  ", the layer has " + shape(layer.num_experts, layer.hidden, layer.ffn_hidden, layer.activation, layer.swiglu) +
                  ": give weights of the layer's shape");
}

ExpertWeights empty_weights(const MoeConfig& config) {
  ExpertWeights w;
  w.num_experts = config.num_experts;
  w.hidden = config.hidden;
  w.ffn_hidden = config.ffn_hidden;
  w.activation = config.activation;
  w.swiglu = config.swiglu;
  w.dtype = config.dtype;
  const auto matrix = static_cast<std::size_t>(config.num_experts * config.hidden * config.ffn_hidden);
  w.w1t.resize(matrix);
  if (config.activation == Activation::SwiGLU) w.w3t.resize(matrix);
  w.w2t.resize(matrix);
  return w;
}

void set_expert(ExpertWeights& weights, std::int64_t expert, std::span<const float> w1,
                std::span<const float> w3, std::span<const float> w2) {
  const std::int64_t h = weights.hidden, f = weights.ffn_hidden;
  const auto size = static_cast<std::size_t>(h * f);
  const bool swiglu = weights.activation == Activation::SwiGLU;
  if (w1.size() != size || w2.size() != size || (swiglu && w3.size() != size)) {
    throw_bad_input("expert " + std::to_string(expert) + ": weight matrices must hold hidden x ffn = " +
                    std::to_string(size) + " values");
  }
  float* gate = weights.w1t.data() + expert * h * f;
  float* up = swiglu ? weights.w3t.data() + expert * h * f : nullptr;
  float* down = weights.w2t.data() + expert * f * h;
  for (std::int64_t o = 0; o < f; ++o) {
    for (std::int64_t i = 0; i < h; ++i) {
      gate[i * f + o] = round_to(weights.dtype, w1[static_cast<std::size_t>(o * h + i)]);
      if (swiglu) up[i * f + o] = round_to(weights.dtype, w3[static_cast<std::size_t>(o * h + i)]);
    }
  }
  for (std::int64_t o = 0; o < h; ++o) {
    for (std::int64_t i = 0; i < f; ++i) down[i * h + o] = round_to(weights.dtype, w2[static_cast<std::size_t>(o * f + i)]);
  }
}

void set_expert_biases(ExpertWeights& weights, std::int64_t expert, std::span<const float> b1,
                       std::span<const float> b3, std::span<const float> b2) {
  const std::int64_t h = weights.hidden, f = weights.ffn_hidden;
  if (static_cast<std::int64_t>(b1.size()) != f || static_cast<std::int64_t>(b3.size()) != f || static_cast<std::int64_t>(b2.size()) != h) {
    throw_bad_input("expert " + std::to_string(expert) + ": biases must hold ffn, ffn and hidden values");
  }
  if (!weights.has_biases()) {
    weights.b1.assign(static_cast<std::size_t>(weights.num_experts * f), 0.0f);
    weights.b3.assign(static_cast<std::size_t>(weights.num_experts * f), 0.0f);
    weights.b2.assign(static_cast<std::size_t>(weights.num_experts * h), 0.0f);
  }
  for (std::int64_t o = 0; o < f; ++o) {
    weights.b1[static_cast<std::size_t>(expert * f + o)] = round_to(weights.dtype, b1[static_cast<std::size_t>(o)]);
    weights.b3[static_cast<std::size_t>(expert * f + o)] = round_to(weights.dtype, b3[static_cast<std::size_t>(o)]);
  }
  for (std::int64_t o = 0; o < h; ++o) weights.b2[static_cast<std::size_t>(expert * h + o)] = round_to(weights.dtype, b2[static_cast<std::size_t>(o)]);
}

ExpertWeights random_weights(const MoeConfig& config, std::uint64_t seed) {
  ExpertWeights w = empty_weights(config);
  std::mt19937_64 rng(seed);
  // Var(x w) = fan_in * var(w): uniform(-a, a) with a = sqrt(3 / fan_in) keeps unit variance.
  auto fill = [&](std::vector<float>& values, std::int64_t fan_in) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const float scale = std::sqrt(3.0f / static_cast<float>(fan_in));
    for (float& v : values) v = round_to(config.dtype, dist(rng) * scale);
  };
  fill(w.w1t, config.hidden);
  fill(w.w3t, config.hidden);
  fill(w.w2t, config.ffn_hidden);
  return w;
}

}  // namespace tilemoe
