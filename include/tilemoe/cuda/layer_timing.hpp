#pragma once
// Timing of MoeLayer::forward the way every tilemoe benchmark does it: inputs rotated through
// more than the L2 (random bf16, never zeros), 3 warm-up runs, per-stage CUDA events, medians.
#include <cuda_runtime.h>

#include <cstdint>

#include "tilemoe/cuda/moe_layer.hpp"

namespace tilemoe::cuda {

struct LayerTiming {
  double stage_ms[kStageCount] = {};  // medians
  double total_ms = 0.0;              // median of router-to-combine
  int runs = 0;
};

// logits: [tokens, experts] fp32 on the device. Checks the layer's device errors every run.
LayerTiming time_layer_forward(MoeLayer& layer, const float* logits, std::int64_t tokens, int runs, cudaStream_t stream);

}  // namespace tilemoe::cuda
