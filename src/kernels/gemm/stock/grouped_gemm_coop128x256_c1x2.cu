// Grouped GEMM configuration: cooperative, tile 128x256x64, cluster 1x2. The only instantiation
// of this TU (about a minute of compile time).
#include "kernels/gemm/stock/grouped_gemm_kernel.cuh"

namespace tilemoe::cuda::detail {

std::unique_ptr<GroupedGemmBackend> make_grouped_gemm_coop128x256_c1x2(int max_groups, int device,
                                                                       int sm_limit) {
  using TileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;
  return std::make_unique<CutlassGroupedGemm<TileShape, ClusterShape>>(max_groups, device, sm_limit);
}

}  // namespace tilemoe::cuda::detail
