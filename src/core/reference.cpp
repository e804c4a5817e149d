#include "tilemoe/reference.hpp"

#include <cmath>

#include "expert_math.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe {

std::vector<Matrix> dense_reference(const EpWorld& world, const std::vector<Matrix>& inputs,
                                    const std::vector<Routing>& routing, const ExpertWeights& weights) {
  const std::int64_t h = world.layer.hidden, f = world.layer.ffn_hidden, k = world.layer.top_k;
  const DType dtype = world.layer.dtype;
  std::vector<float> x(static_cast<std::size_t>(h)), act(static_cast<std::size_t>(f)), y(static_cast<std::size_t>(h)),
      acc(static_cast<std::size_t>(h));
  std::vector<Matrix> outputs;
  for (int rank = 0; rank < world.world_size(); ++rank) {
    const Matrix& in = inputs.at(static_cast<std::size_t>(rank));
    const Routing& r = routing.at(static_cast<std::size_t>(rank));
    Matrix out(dtype, in.rows, h);
    for (std::int64_t t = 0; t < in.rows; ++t) {
      load_row(in.dtype, in.row(t), static_cast<std::size_t>(h), x.data());
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (std::int64_t j = 0; j < k; ++j) {
        const std::size_t s = r.slot(t, j);
        if (!r.kept[s]) continue;
        math::gemm0_rows(weights, r.expert[s], x.data(), 1, 0, f, act.data());
        for (float& v : act) v = round_to(dtype, v);  // stored between the GEMMs
        math::gemm1_rows(weights, r.expert[s], act.data(), 1, 0, h, y.data());
        for (float& v : y) v = round_to(dtype, v);    // stored after GEMM1
        math::accumulate_slot(r.weight[s], y.data(), h, acc.data());
      }
      store_row(dtype, acc.data(), static_cast<std::size_t>(h), out.row(t));
    }
    outputs.push_back(std::move(out));
  }
  return outputs;
}

std::vector<std::vector<double>> fp64_reference(const EpWorld& world, const std::vector<Matrix>& inputs,
                                                const std::vector<Routing>& routing,
                                                const ExpertWeights& weights) {
  const std::int64_t h = world.layer.hidden, f = world.layer.ffn_hidden, k = world.layer.top_k;
  const bool swiglu = weights.activation == Activation::SwiGLU;
  std::vector<std::vector<double>> outputs;
  std::vector<double> act(static_cast<std::size_t>(f));
  for (int rank = 0; rank < world.world_size(); ++rank) {
    const Matrix& in = inputs.at(static_cast<std::size_t>(rank));
    const Routing& r = routing.at(static_cast<std::size_t>(rank));
    std::vector<double> out(static_cast<std::size_t>(in.rows * h), 0.0);
    const std::vector<float> x = in.to_floats();
    for (std::int64_t t = 0; t < in.rows; ++t) {
      const float* xt = x.data() + t * h;
      for (std::int64_t j = 0; j < k; ++j) {
        const std::size_t s = r.slot(t, j);
        if (!r.kept[s]) continue;
        const std::int64_t e = r.expert[s];
        for (std::int64_t n = 0; n < f; ++n) {
          double g = 0.0, u = 0.0;
          for (std::int64_t i = 0; i < h; ++i) {
            g += double(xt[i]) * weights.gate(e)[i * f + n];
            if (swiglu) u += double(xt[i]) * weights.up(e)[i * f + n];
          }
          act[static_cast<std::size_t>(n)] = swiglu ? g / (1.0 + std::exp(-g)) * u : 0.5 * g * (1.0 + std::erf(g / std::sqrt(2.0)));
        }
        for (std::int64_t c = 0; c < h; ++c) {
          double y = 0.0;
          for (std::int64_t n = 0; n < f; ++n) y += act[static_cast<std::size_t>(n)] * weights.down(e)[n * h + c];
          out[static_cast<std::size_t>(t * h + c)] += double(r.weight[s]) * y;
        }
      }
    }
    outputs.push_back(std::move(out));
  }
  return outputs;
}

namespace {

template <typename Value>
ErrorStats compare_impl(const std::vector<Matrix>& outputs, std::size_t ranks, Value&& reference_value) {
  ErrorStats stats;
  double diff2 = 0.0, ref2 = 0.0;
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::vector<float> a = outputs[r].to_floats();
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double b = reference_value(r, i);
      if (!std::isfinite(a[i])) stats.finite = false;
      const double d = double(a[i]) - b;
      stats.max_abs = std::max(stats.max_abs, std::abs(d));
      diff2 += d * d;
      ref2 += b * b;
    }
  }
  if (!stats.finite) {
    stats.max_abs = INFINITY;
    stats.relative_frobenius = INFINITY;
  } else {
    stats.relative_frobenius = ref2 > 0 ? std::sqrt(diff2 / ref2) : (diff2 > 0 ? INFINITY : 0.0);
  }
  return stats;
}

}  // namespace

ErrorStats compare(const std::vector<Matrix>& outputs, const std::vector<Matrix>& reference) {
  if (outputs.size() != reference.size()) throw_internal("compare: rank counts differ");
  std::vector<std::vector<float>> ref;
  for (const Matrix& m : reference) ref.push_back(m.to_floats());
  return compare_impl(outputs, outputs.size(), [&](std::size_t r, std::size_t i) { return double(ref[r].at(i)); });
}

ErrorStats compare(const std::vector<Matrix>& outputs, const std::vector<std::vector<double>>& reference) {
  if (outputs.size() != reference.size()) throw_internal("compare: rank counts differ");
  return compare_impl(outputs, outputs.size(), [&](std::size_t r, std::size_t i) { return reference[r].at(i); });
}

}  // namespace tilemoe
