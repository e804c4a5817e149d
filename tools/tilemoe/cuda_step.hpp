#pragma once
// `tilemoe run --backend cuda`: the step of one rank on the GPU through cuda::MoeLayer.
#include <vector>

#include "step_options.hpp"

namespace tilemoe::cli {

struct CudaStepOutput {
  std::vector<Matrix> outputs;   // one rank
  std::vector<Routing> routing;  // the routing the GPU chose, to check the expert path on it
  double forward_ms = 0.0;       // one forward after a warm-up, CUDA events
};

CudaStepOutput run_cuda_step(const PreparedStep& step);

// `tilemoe bench --backend cuda`: per-stage medians of the one-GPU forward of `world` (one
// rank) on synthetic logits of `pattern`, weights drawn on the device.
struct CudaBenchResult {
  double stage_ms[7] = {};
  const char* stage_names[7] = {};
  double total_ms = 0.0;
};
CudaBenchResult run_cuda_bench(const EpWorld& world, RoutingPattern pattern, std::uint64_t seed, int runs);

}  // namespace tilemoe::cli
