#pragma once
// Internal to src/exec/cuda: one factory per planned-GEMM instantiation (cluster x epilogue),
// each defined in its own planned_gemm_<cluster>_<epilogue>.cu, the only TUs that include the
// kernel. PlannedGemm (planned_gemm.cpp) checks the arguments and dispatches through this.
#include <cuda_runtime.h>

#include <memory>

#include "kernels/gemm/planned/planned_gemm.hpp"

namespace tilemoe::cuda::detail {

class PlannedGemmBackend {
 public:
  virtual ~PlannedGemmBackend() = default;
  virtual void run(cudaStream_t stream, const PlannedGemmRun& run) = 0;  // arguments already checked
  virtual int grid_ctas() const = 0;
};

#define TILEMOE_PLANNED_FACTORY(name) \
  std::unique_ptr<PlannedGemmBackend> name(int max_groups, int device, int sm_limit)
TILEMOE_PLANNED_FACTORY(make_planned_gemm_c2x1_store);
TILEMOE_PLANNED_FACTORY(make_planned_gemm_c2x1_swiglu);
TILEMOE_PLANNED_FACTORY(make_planned_gemm_c2x1_gelu);
TILEMOE_PLANNED_FACTORY(make_planned_gemm_c1x2_store);
TILEMOE_PLANNED_FACTORY(make_planned_gemm_c1x2_swiglu);
TILEMOE_PLANNED_FACTORY(make_planned_gemm_c1x2_gelu);
#undef TILEMOE_PLANNED_FACTORY

}  // namespace tilemoe::cuda::detail
