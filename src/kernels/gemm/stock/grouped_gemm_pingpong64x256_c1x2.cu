// Grouped GEMM configuration: pingpong, tile 64x256x64, cluster 1x2: for ~128 rows per expert,
// where a 128-row tile leaves a nearly empty second tile for every expert just above 128 rows.
// The only instantiation of this TU (about a minute of compile time).
#include "kernels/gemm/stock/grouped_gemm_kernel.cuh"

namespace tilemoe::cuda::detail {

std::unique_ptr<GroupedGemmBackend> make_grouped_gemm_pingpong64x256_c1x2(int max_groups, int device,
                                                                          int sm_limit) {
  using TileShape = cute::Shape<cute::_64, cute::_256, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;
  return std::make_unique<CutlassGroupedGemm<TileShape, ClusterShape, true>>(max_groups, device, sm_limit);
}

}  // namespace tilemoe::cuda::detail
