#pragma once
// The comet plan the GPU runs: the sequential plan's tiling (128 rows x 256 GEMM columns on the
// planned GEMM's 1x2 pairs: gpu_plan_shape.hpp of sequential) in comet's order, and the column
// split of layer 1 as the layer's schedule chose it (gpu_setup.hpp).
#include <cstdint>

#include "comet_plan.hpp"
#include "strategies/sequential/gpu_plan_shape.hpp"

namespace tilemoe::plan_detail {

inline CometShape gpu_comet_shape(const MoeConfig& layer, int rank, std::int64_t tokens, DispatchVolume dispatch, std::int64_t split_cols,
                                  std::int64_t receive_rows = 0) {
  CometShape shape;
  shape.gemm = gpu_sequential_shape(layer, rank, tokens, dispatch, receive_rows);
  shape.gemm.band_block[0] = shape.gemm.band_block[1] = 0;  // comet orders its bands itself
  shape.split_cols = split_cols;
  return shape;
}

}  // namespace tilemoe::plan_detail
