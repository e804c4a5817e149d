#pragma once
// Grouped bf16 GEMM over the local experts, one CUTLASS sm90 warp-specialised persistent
// pointer-array kernel per configuration. Plain C++ interface: only grouped_gemm_*.cu include
// CUTLASS, so the rest of the build stays fast.
//
// Problem, for each group (expert) g in [0, groups):
//   D_g[M_g][N] = A_g[M_g][K] * B_g^T,   A row-major (K contiguous), B stored [N][K] (the
//   nn.Linear layout, K contiguous), D row-major; bf16 in and out, fp32 accumulation.
// Rows of all groups are contiguous: A_g starts at row row_offset[g] of A, D_g at the same row
// of D; B_g = B + g * N * K. M_g = row_offset[g + 1] - row_offset[g] is read ON THE DEVICE
// (row_offset is a device array of groups + 1 ints), so nothing waits for the host and the
// launch can be captured in a CUDA graph.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace tilemoe::cuda {

enum class GemmConfig {
  Coop128x256Cluster2x1,  // large M per expert (Mixtral-like)
  Coop128x256Cluster1x2,  // small M per expert (DeepSeek-V3-like, ~128 rows)
  Coop256x128Cluster2x1,  // medium M, short K (Qwen3-like)
  Coop256x128Cluster1x2,     // 129-256 rows per expert: one M tile, weights read once
  Pingpong64x256Cluster1x2,  // <= 64 rows per expert
};

const char* gemm_config_name(GemmConfig config);  // e.g. "coop128x256_c1x2"
constexpr GemmConfig kAllGemmConfigs[] = {GemmConfig::Coop128x256Cluster2x1, GemmConfig::Coop128x256Cluster1x2,
                                          GemmConfig::Coop256x128Cluster2x1, GemmConfig::Coop256x128Cluster1x2,
                                          GemmConfig::Pingpong64x256Cluster1x2};

class GroupedGemm {
 public:
  // Sizes device workspaces for up to `max_groups` groups. sm_limit > 0 leaves the other SMs
  // free (sets both sm_count and max_active_clusters, see the CUTLASS guide, 3.4).
  GroupedGemm(GemmConfig config, int max_groups, int device, int sm_limit = 0);
  ~GroupedGemm();
  GroupedGemm(const GroupedGemm&) = delete;
  GroupedGemm& operator=(const GroupedGemm&) = delete;

  // Enqueues on `stream`: a small kernel that writes the per-group shapes, pointers and
  // strides from row_offset, then the grouped GEMM. N and K must be multiples of 8 and every
  // pointer 16-byte aligned (checked on the host: a bad-input tilemoe::Error).
  void run(cudaStream_t stream, int groups, const int* row_offset_device, const __nv_bfloat16* A,
           const __nv_bfloat16* B, __nv_bfloat16* D, int N, int K);

  GemmConfig config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tilemoe::cuda
