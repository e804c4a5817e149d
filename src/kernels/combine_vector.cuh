#pragma once
// One 8-element vector of a token's combined output: the top-k weighted sum of its rows in
// top-k slot order (a slot the capacity rule dropped, row -1, adds nothing), fp32 products and
// sums rounded at each step, then rounded once to bf16.
// Every combine kernel (the one-GPU layer's, the tile-signal owner's) computes it this way,
// so their outputs are bitwise equal whatever their grids.
#include <cuda_bf16.h>

#include <cstddef>

namespace tilemoe::cuda {

__device__ inline uint4 combine_vector(const __nv_bfloat16* y, const float* weight, const int* row_of_slot, int token, int top_k,
                                       int hidden, int v) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < top_k; ++j) {
    const int slot = token * top_k + j;
    const int row = row_of_slot[slot];
    if (row < 0) continue;
    const float w = weight[slot];
    const uint4 packed = reinterpret_cast<const uint4*>(y + static_cast<std::size_t>(row) * hidden)[v];
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
    for (int q = 0; q < 4; ++q) {
      acc[2 * q] = __fadd_rn(acc[2 * q], __fmul_rn(w, __bfloat162float(pairs[q].x)));
      acc[2 * q + 1] = __fadd_rn(acc[2 * q + 1], __fmul_rn(w, __bfloat162float(pairs[q].y)));
    }
  }
  uint4 result;
  __nv_bfloat162* r = reinterpret_cast<__nv_bfloat162*>(&result);
  for (int q = 0; q < 4; ++q) r[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
  return result;
}

}  // namespace tilemoe::cuda
