#include "expert_math.hpp"


namespace tilemoe::math {

namespace {

// acc[n] += a[k] * b[k][n] over k ascending, for n in [0, width): the fixed K order that makes
// the result independent of tiling. b rows are `stride` apart.
void row_times_matrix(const float* a, std::int64_t depth, const float* b, std::int64_t stride,
                      std::int64_t width, float* acc) {
  for (std::int64_t n = 0; n < width; ++n) acc[n] = 0.0f;
  for (std::int64_t k = 0; k < depth; ++k) {
    const float ak = a[k];
    const float* bk = b + k * stride;
    for (std::int64_t n = 0; n < width; ++n) acc[n] += ak * bk[n];
  }
}

// acc[n] += bias[n]: a bias joins the fp32 sum once it is complete, so tiling cannot change it
void add_bias(const float* bias, std::int64_t width, float* acc) {
  for (std::int64_t n = 0; n < width; ++n) acc[n] += bias[n];
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float gelu(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }

}  // namespace

void gemm0_rows(const ExpertWeights& w, std::int64_t expert, const float* x, std::int64_t rows,
                std::int64_t col_begin, std::int64_t col_end, float* out) {
  const std::int64_t width = col_end - col_begin;
  std::vector<float> up(static_cast<std::size_t>(width));
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* xi = x + i * w.hidden;
    float* oi = out + i * width;
    row_times_matrix(xi, w.hidden, w.gate(expert) + col_begin, w.ffn_hidden, width, oi);
    if (w.has_biases()) add_bias(w.b1.data() + expert * w.ffn_hidden + col_begin, width, oi);
    if (w.activation == Activation::SwiGLU) {
      row_times_matrix(xi, w.hidden, w.up(expert) + col_begin, w.ffn_hidden, width, up.data());
      if (w.has_biases()) add_bias(w.b3.data() + expert * w.ffn_hidden + col_begin, width, up.data());
      if (w.swiglu.is_default()) {
        for (std::int64_t n = 0; n < width; ++n) oi[n] = silu(oi[n]) * up[static_cast<std::size_t>(n)];
      } else {
        for (std::int64_t n = 0; n < width; ++n) oi[n] = clamped_swiglu(w.swiglu, oi[n], up[static_cast<std::size_t>(n)]);
      }
    } else {
      for (std::int64_t n = 0; n < width; ++n) oi[n] = gelu(oi[n]);
    }
  }
}

void gemm1_rows(const ExpertWeights& w, std::int64_t expert, const float* a, std::int64_t rows,
                std::int64_t col_begin, std::int64_t col_end, float* out) {
  const std::int64_t width = col_end - col_begin;
  for (std::int64_t i = 0; i < rows; ++i) {
    row_times_matrix(a + i * w.ffn_hidden, w.ffn_hidden, w.down(expert) + col_begin, w.hidden, width, out + i * width);
    if (w.has_biases()) add_bias(w.b2.data() + expert * w.hidden + col_begin, width, out + i * width);
  }
}

void accumulate_slot(float weight, const float* y, std::int64_t count, float* acc) {
  for (std::int64_t c = 0; c < count; ++c) acc[c] += weight * y[c];
}

void expert_row_fp64(const ExpertWeights& w, std::int64_t expert, const float* x, double input_scale, std::vector<double>& g,
                     std::vector<double>& u, std::vector<double>& y) {
  const std::int64_t h = w.hidden, f = w.ffn_hidden;
  const bool swiglu = w.activation == Activation::SwiGLU;
  const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  std::fill(g.begin(), g.end(), 0.0);
  std::fill(u.begin(), u.end(), 0.0);
  for (std::int64_t i = 0; i < h; ++i) {  // the weights read along their rows (contiguous)
    const double xi = input_scale * x[i];
    const float* gate = w.gate(expert) + i * f;
    for (std::int64_t n = 0; n < f; ++n) g[at(n)] += xi * gate[n];
    if (swiglu) {
      const float* up = w.up(expert) + i * f;
      for (std::int64_t n = 0; n < f; ++n) u[at(n)] += xi * up[n];
    }
  }
  for (std::int64_t n = 0; n < f; ++n) {
    double gn = g[at(n)], un = u[at(n)];
    if (w.has_biases()) {
      gn += w.b1[at(expert * f + n)];
      un += w.b3[at(expert * f + n)];
    }
    g[at(n)] = !swiglu                ? 0.5 * gn * (1.0 + std::erf(gn / std::sqrt(2.0)))
               : w.swiglu.is_default() ? gn / (1.0 + std::exp(-gn)) * un
                                       : clamped_swiglu(w.swiglu, gn, un);
  }
  for (std::int64_t c = 0; c < h; ++c) y[at(c)] = w.has_biases() ? w.b2[at(expert * h + c)] : 0.0;
  for (std::int64_t n = 0; n < f; ++n) {
    const double a = g[at(n)];
    const float* down = w.down(expert) + n * h;
    for (std::int64_t c = 0; c < h; ++c) y[at(c)] += a * down[c];
  }
}

}  // namespace tilemoe::math
