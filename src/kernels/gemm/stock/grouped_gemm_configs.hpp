#pragma once
// Internal to src/exec/cuda: one factory per CUTLASS configuration, each defined in its own
// grouped_gemm_<config>.cu (the only TUs that include CUTLASS). GroupedGemm (grouped_gemm.cpp)
// checks the arguments and dispatches through this interface.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <memory>

namespace tilemoe::cuda::detail {

class GroupedGemmBackend {
 public:
  virtual ~GroupedGemmBackend() = default;
  // Arguments already checked by GroupedGemm::run (0 < groups <= max_groups, N, K > 0 and
  // multiples of 8, pointers non-null and 16-byte aligned); the current device is the one given
  // to the factory.
  virtual void run(cudaStream_t stream, int groups, const int* row_offset_device,
                   const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* D, int N,
                   int K) = 0;
};

// Each factory expects the current device to be `device` and returns a ready object (device
// arrays and workspace allocated, kernel attributes set). Throws tilemoe::Error (Internal) on a
// CUDA or CUTLASS failure.
std::unique_ptr<GroupedGemmBackend> make_grouped_gemm_coop128x256_c2x1(int max_groups, int device,
                                                                       int sm_limit);
std::unique_ptr<GroupedGemmBackend> make_grouped_gemm_coop128x256_c1x2(int max_groups, int device,
                                                                       int sm_limit);
std::unique_ptr<GroupedGemmBackend> make_grouped_gemm_coop256x128_c2x1(int max_groups, int device,
                                                                       int sm_limit);
std::unique_ptr<GroupedGemmBackend> make_grouped_gemm_coop256x128_c1x2(int max_groups, int device,
                                                                       int sm_limit);
std::unique_ptr<GroupedGemmBackend> make_grouped_gemm_pingpong64x256_c1x2(int max_groups, int device,
                                                                          int sm_limit);

}  // namespace tilemoe::cuda::detail
