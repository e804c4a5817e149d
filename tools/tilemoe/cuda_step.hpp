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

}  // namespace tilemoe::cli
