#pragma once
// The tile_signal plan the GPU runs: the sequential plan's tiling (gpu_plan_shape.hpp of
// sequential), GEMM1 in the band blocks and the consumer in the segments the schedule chose
// (gpu_setup.hpp).
#include <cstdint>

#include "strategies/sequential/gpu_plan_shape.hpp"
#include "tile_signal_plan.hpp"

namespace tilemoe::plan_detail {

inline TileSignalShape gpu_tile_signal_shape(const MoeConfig& layer, int rank, std::int64_t tokens, int band_block, int bands_per_segment,
                                             DispatchVolume dispatch, std::int64_t receive_rows = 0) {
  TileSignalShape shape;
  shape.gemm = gpu_sequential_shape(layer, rank, tokens, dispatch, receive_rows);
  shape.gemm.band_block[1] = band_block;
  shape.bands_per_segment = bands_per_segment;
  return shape;
}

}  // namespace tilemoe::plan_detail
