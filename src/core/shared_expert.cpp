#include "tilemoe/shared_expert.hpp"

#include <cmath>
#include <string>

#include "expert_math.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe {

SharedExpert make_shared_expert(const MoeConfig& layer, std::int64_t ffn_hidden, std::span<const float> w1,
                                std::span<const float> w3, std::span<const float> w2, std::span<const float> gate) {
  if (ffn_hidden <= 0) throw_bad_input("the shared expert's width is " + std::to_string(ffn_hidden) + ": it must be positive");
  MoeConfig one = layer;
  one.num_experts = 1;
  one.ffn_hidden = ffn_hidden;
  SharedExpert shared{empty_weights(one), {}};
  set_expert(shared.ffn, 0, w1, w3, w2);
  if (!gate.empty()) {
    if (static_cast<std::int64_t>(gate.size()) != layer.hidden) {
      throw_bad_input("the shared expert's gate has " + std::to_string(gate.size()) + " values, the layer's width is " +
                      std::to_string(layer.hidden));
    }
    for (float v : gate) shared.gate.push_back(round_to(layer.dtype, v));
  }
  for (const std::vector<float>* values : {&shared.ffn.w1t, &shared.ffn.w3t, &shared.ffn.w2t, &shared.gate}) {
    for (float v : *values) {
      if (!std::isfinite(v)) throw_bad_input("the shared expert holds a value that is not finite in the layer's dtype");
    }
  }
  return shared;
}

void add_shared_expert(const SharedExpert& shared, const Matrix& input, Matrix& output) {
  const ExpertWeights& w = shared.ffn;
  const std::int64_t h = w.hidden, f = w.ffn_hidden;
  if (input.cols != h || output.cols != h || input.rows != output.rows || input.dtype != w.dtype || output.dtype != w.dtype) {
    throw_internal("add_shared_expert: input " + std::to_string(input.rows) + " x " + std::to_string(input.cols) + ", output " +
                   std::to_string(output.rows) + " x " + std::to_string(output.cols) + ", shared expert of width " + std::to_string(h));
  }
  const DType dtype = w.dtype;
  std::vector<float> x(static_cast<std::size_t>(h)), act(static_cast<std::size_t>(f)), y(static_cast<std::size_t>(h)),
      out(static_cast<std::size_t>(h));
  for (std::int64_t t = 0; t < input.rows; ++t) {
    load_row(dtype, input.row(t), x.size(), x.data());
    math::gemm0_rows(w, 0, x.data(), 1, 0, f, act.data());
    for (float& v : act) v = round_to(dtype, v);  // stored between the GEMMs, as a routed expert's
    math::gemm1_rows(w, 0, act.data(), 1, 0, h, y.data());
    for (float& v : y) v = round_to(dtype, v);
    if (!shared.gate.empty()) {
      float g = 0.0f;  // x . gate over h ascending, as every product here
      for (std::int64_t i = 0; i < h; ++i) g += x[static_cast<std::size_t>(i)] * shared.gate[static_cast<std::size_t>(i)];
      const float scale = round_to(dtype, 1.0f / (1.0f + std::exp(-round_to(dtype, g))));
      for (float& v : y) v = round_to(dtype, scale * v);
    }
    load_row(dtype, output.row(t), out.size(), out.data());
    for (std::size_t c = 0; c < out.size(); ++c) out[c] += y[c];
    store_row(dtype, out.data(), out.size(), output.row(t));
  }
}

void add_shared_expert_fp64(const SharedExpert& shared, const Matrix& input, std::vector<double>& output) {
  const ExpertWeights& w = shared.ffn;
  const std::int64_t h = w.hidden, f = w.ffn_hidden;
  if (input.cols != h || output.size() != static_cast<std::size_t>(input.rows * h)) throw_internal("add_shared_expert_fp64: shapes differ");
  const std::vector<float> x = input.to_floats();
  std::vector<double> g(static_cast<std::size_t>(f)), u(static_cast<std::size_t>(f)), y(static_cast<std::size_t>(h));
  for (std::int64_t t = 0; t < input.rows; ++t) {
    const float* xt = x.data() + t * h;
    math::expert_row_fp64(w, 0, xt, 1.0, g, u, y);
    double scale = 1.0;
    if (!shared.gate.empty()) {
      double logit = 0.0;
      for (std::int64_t i = 0; i < h; ++i) logit += double(xt[i]) * shared.gate[static_cast<std::size_t>(i)];
      scale = 1.0 / (1.0 + std::exp(-logit));
    }
    for (std::int64_t c = 0; c < h; ++c) output[static_cast<std::size_t>(t * h + c)] += scale * y[static_cast<std::size_t>(c)];
  }
}

}  // namespace tilemoe
