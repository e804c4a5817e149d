#pragma once
// The sequential plan the GPU runs: the planned GEMM's tiles (128 rows x 256 GEMM columns, which
// SwiGLU's epilogue halves to 128 output columns) in its order on 1x2 clusters, GEMM0 in blocks
// of kGemm0BandBlock bands; the CPU engine's combine tasks (the GPU's combine does not read them
// yet). The layer compiles it on the device every step; tests and benches compile it on the host
// for the same counts.
#include <cstdint>

#include "plan/gpu_tables.hpp"
#include "strategies/sequential/exchange_setup.hpp"
#include "strategies/sequential/sequential_plan.hpp"
#include "tilemoe/config.hpp"

namespace tilemoe::plan_detail {

// `receive_rows`: the most expert rows the rank's buffers hold (0: no bound). `dispatch`: the
// layer's dispatch volume (EpMoeLayerOptions::dispatch_volume as the layer resolved it).
inline SequentialShape gpu_sequential_shape(const MoeConfig& layer, int rank, std::int64_t tokens, DispatchVolume dispatch,
                                            std::int64_t receive_rows = 0) {
  SequentialShape shape;
  shape.rank = rank;
  shape.tokens = tokens;
  shape.hidden = layer.hidden;
  shape.ffn_hidden = layer.ffn_hidden;
  shape.tile_m = cuda::kPlannedTileM;
  shape.tile_n[0] = layer.activation == Activation::SwiGLU ? cuda::kPlannedTileN / 2 : cuda::kPlannedTileN;
  shape.tile_n[1] = cuda::kPlannedTileN;
  // 1x2 clusters: the planned GEMM alone was faster on them than on 2x1 at every benchmark shape
  // (BENCHMARKS.md, second and fourth cut of the planned GEMM)
  shape.cluster = cuda::PlannedCluster::N2;
  shape.band_block[0] = cuda::kGemm0BandBlock;
  shape.band_block[1] = 0;
  shape.combine_tokens = PlanOptions{}.combine_tokens;
  shape.receive_rows = receive_rows;
  shape.dispatch = dispatch;
  return shape;
}

}  // namespace tilemoe::plan_detail
