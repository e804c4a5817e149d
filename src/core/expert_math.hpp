#pragma once
// The arithmetic of a MoE step, shared by the CPU executor and the dense reference, so that
// both do the same fp32 operations in the same order: a row's result never depends on how
// rows or columns are tiled (each output element sums over K in ascending order, one product
// at a time), and a token's k outputs are summed in top-k slot order.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tilemoe/weights.hpp"

namespace tilemoe::math {

// out[i][c - col_begin] for c in [col_begin, col_end): activation(x_i w1^T)[c] (* x_i w3^T[c])
// for `rows` input rows of width hidden (fp32 values of the stored inputs). Not rounded.
void gemm0_rows(const ExpertWeights& w, std::int64_t expert, const float* x, std::int64_t rows,
                std::int64_t col_begin, std::int64_t col_end, float* out);

// out[i][c - col_begin] = (a_i w2^T)[c] for `rows` activation rows of width ffn. Not rounded.
void gemm1_rows(const ExpertWeights& w, std::int64_t expert, const float* a, std::int64_t rows,
                std::int64_t col_begin, std::int64_t col_end, float* out);

// acc[c] += weight * y[c] for c in [0, count): one slot of the top-k sum.
void accumulate_slot(float weight, const float* y, std::int64_t count, float* acc);

// GPT-OSS's SwiGLU (config.hpp's SwigluVariant) in its operations' order, in float for every
// executor and in double for the fp64 reference.
template <class Real>
Real clamped_swiglu(const SwigluVariant& v, Real gate, Real up) {
  if (v.limit > 0.0f) {
    gate = std::min(gate, Real(v.limit));
    up = std::clamp(up, -Real(v.limit), Real(v.limit));
  }
  const Real glu = gate * (Real(1) / (Real(1) + std::exp(-(Real(v.alpha) * gate))));
  return (up + Real(v.up_offset)) * glu;
}

// One expert on one token in fp64 without intermediate rounding (the fp64 reference's
// arithmetic; every sum over its index ascending): y = expert(input_scale * x), biases and
// activation variant included. g and u are scratch of ffn values, y of hidden.
void expert_row_fp64(const ExpertWeights& w, std::int64_t expert, const float* x, double input_scale, std::vector<double>& g,
                     std::vector<double>& u, std::vector<double>& y);

}  // namespace tilemoe::math
