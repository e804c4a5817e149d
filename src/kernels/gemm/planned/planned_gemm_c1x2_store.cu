// Planned GEMM instantiation: cluster c1x2, epilogue Store. The only instantiation of this TU.
#include "kernels/gemm/planned/planned_gemm_kernel.cuh"

namespace tilemoe::cuda::detail {

std::unique_ptr<PlannedGemmBackend> make_planned_gemm_c1x2_store(int max_groups, int device, int sm_limit) {
  using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;
  return std::make_unique<PlannedGemmImpl<ClusterShape, PlannedEpilogue::Store>>(max_groups, device, sm_limit);
}

}  // namespace tilemoe::cuda::detail
