#pragma once
// What the GPU tests read of an EpMoeLayer's last step that no user of the layer needs: the
// plan its strategy compiled on the device, downloaded, so that the tests can hold it against
// the host compiler's, validate it and run it on the CPU executor; and
// the intermediates the one-GPU layer (a world of one) exposes to its benchmarks' baselines.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "strategies/tile_signal/gpu_setup.hpp"
#include "tilemoe/plan.hpp"
#include "tilemoe/cuda/ep_moe_layer.hpp"

namespace tilemoe::cuda {

struct EpMoeLayerInspector {
  // Waits for the step (bounded), then downloads the plan the device compiled for it (the
  // strategy's on the planned GEMM; the sequential one with EpMoeLayerHarness::build_device_plan
  // on the stock GEMM path): its tables and header, not its per-token tables.
  static StepPlan last_device_plan(const EpMoeLayer& layer, cudaStream_t stream);
  // tile_signal's schedule as the layer's ranks agreed on it (its band block and bands per
  // segment shape the plan a host compiler must match).
  static TileSignalGpuSchedule tile_signal_schedule(const EpMoeLayer& layer);

  // Device pointers of the last step's intermediates, which the one-GPU layer (a world of one)
  // hands to baselines that reuse them (MoeLayer::row_offset and the others).
  static const int* row_offset(const EpMoeLayer& layer);                 // [E + 1], the layout's
  static const __nv_bfloat16* expert_rows(const EpMoeLayer& layer);      // the rows GEMM0 reads
  static const __nv_bfloat16* expert_weights0(const EpMoeLayer& layer);  // the local experts'
  static const __nv_bfloat16* expert_weights2(const EpMoeLayer& layer);
  static std::string gemm_description(const EpMoeLayer& layer);
};

}  // namespace tilemoe::cuda
