#pragma once
// What the GPU tests read of an EpMoeLayer's last step that no user of the layer needs: the
// tables its strategy built on the device, downloaded, so that the tests can hold them against
// the host compiler's (tile_signal_tables) and run the same schedule on the CPU executor; and
// the intermediates the one-GPU layer (a world of one) exposes to its benchmarks' baselines.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "plan/gpu_tables.hpp"
#include "tilemoe/plan.hpp"
#include "tilemoe/cuda/ep_moe_layer.hpp"

namespace tilemoe::cuda {

struct EpLayerTables {
  std::vector<int> row_offset;       // [local experts + 1] the local experts' rows
  std::vector<int> block_offset;     // [local experts * world + 1] those rows split by source rank
  std::vector<GemmTileEntry> gemm1;  // GEMM1's table, in the order the GEMM ran it
  std::vector<TileBand> bands;       // tile_signal: the consumer's band list (empty otherwise)
  int band_block = 0;                // tile_signal: GEMM1's band blocks
  int bands_per_segment = 0;         // tile_signal: bands per consumer segment
};

struct EpMoeLayerInspector {
  // Waits for the step (bounded, as check() does), then downloads its tables.
  static EpLayerTables last_tables(const EpMoeLayer& layer, cudaStream_t stream);
  // Waits for the step (bounded), then downloads the plan the device compiled for it
  // (the sequential strategy's; EpMoeLayerHarness::build_device_plan on the stock GEMM path):
  // its tables and header, not its per-token tables.
  static StepPlan last_device_plan(const EpMoeLayer& layer, cudaStream_t stream);

  // Device pointers of the last step's intermediates, which the one-GPU layer (a world of one)
  // hands to baselines that reuse them (MoeLayer::row_offset and the others).
  static const int* row_offset(const EpMoeLayer& layer);                 // [E + 1], the layout's
  static const __nv_bfloat16* expert_rows(const EpMoeLayer& layer);      // the rows GEMM0 reads
  static const __nv_bfloat16* expert_weights0(const EpMoeLayer& layer);  // the local experts'
  static const __nv_bfloat16* expert_weights2(const EpMoeLayer& layer);
  static std::string gemm_description(const EpMoeLayer& layer);
};

}  // namespace tilemoe::cuda
