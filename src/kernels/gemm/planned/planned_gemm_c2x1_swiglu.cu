// Planned GEMM instantiation: cluster c2x1, epilogue SwiGLU. The only instantiation of this TU.
#include "kernels/gemm/planned/planned_gemm_kernel.cuh"

namespace tilemoe::cuda::detail {

std::unique_ptr<PlannedGemmBackend> make_planned_gemm_c2x1_swiglu(int max_groups, int device, int sm_limit) {
  using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
  return std::make_unique<PlannedGemmImpl<ClusterShape, PlannedEpilogue::SwiGLU>>(max_groups, device, sm_limit);
}

}  // namespace tilemoe::cuda::detail
