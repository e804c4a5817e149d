// GroupedGemm: argument checks and dispatch to one CUTLASS configuration (grouped_gemm_*.cu).
// Plain C++ (no CUTLASS, no device code): compiles with the host compiler against the CUDA
// runtime headers.
#include "kernels/gemm/stock/grouped_gemm.hpp"

#include <cstdint>
#include <string>

#include "tilemoe/cuda/cuda_check.hpp"
#include "kernels/gemm/stock/grouped_gemm_configs.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

// Makes `device` current for the scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    TILEMOE_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) TILEMOE_CUDA_CHECK(cudaSetDevice(device));
    changed_ = previous_ != device;
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);  // best effort: no throwing from a destructor
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

}  // namespace

const char* gemm_config_name(GemmConfig config) {
  switch (config) {
    case GemmConfig::Coop128x256Cluster2x1: return "coop128x256_c2x1";
    case GemmConfig::Coop128x256Cluster1x2: return "coop128x256_c1x2";
    case GemmConfig::Coop256x128Cluster2x1: return "coop256x128_c2x1";
    case GemmConfig::Coop256x128Cluster1x2: return "coop256x128_c1x2";
    case GemmConfig::Pingpong64x256Cluster1x2: return "pingpong64x256_c1x2";
  }
  return "unknown";
}

namespace {

void check_aligned(const void* p, const char* name) {
  if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) {
    throw_bad_input(std::string("grouped GEMM: ") + name +
                    " must be 16-byte aligned (TMA), got " +
                    std::to_string(reinterpret_cast<std::uintptr_t>(p)));
  }
}

}  // namespace

struct GroupedGemm::Impl {
  GemmConfig config;
  int max_groups;
  int device;
  std::unique_ptr<detail::GroupedGemmBackend> backend;
};

GroupedGemm::GroupedGemm(GemmConfig config, int max_groups, int device, int sm_limit) {
  if (max_groups < 1) {
    throw_bad_input("grouped GEMM: max_groups must be >= 1, got " + std::to_string(max_groups));
  }
  if (sm_limit < 0) {
    throw_bad_input("grouped GEMM: sm_limit must be >= 0, got " + std::to_string(sm_limit));
  }
  int devices = 0;
  TILEMOE_CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (device < 0 || device >= devices) {
    throw_bad_input("grouped GEMM: device " + std::to_string(device) + " does not exist (" +
                    std::to_string(devices) + " CUDA devices)");
  }
  DeviceGuard guard(device);
  cudaDeviceProp prop{};
  TILEMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  if (prop.major != 9 || prop.minor != 0) {
    throw_bad_input(std::string("grouped GEMM ") + gemm_config_name(config) +
                    " needs an sm_90 (Hopper) GPU; device " + std::to_string(device) + " (" +
                    prop.name + ") is sm_" + std::to_string(prop.major) +
                    std::to_string(prop.minor));
  }

  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->max_groups = max_groups;
  impl->device = device;
  switch (config) {
    case GemmConfig::Coop128x256Cluster2x1:
      impl->backend = detail::make_grouped_gemm_coop128x256_c2x1(max_groups, device, sm_limit);
      break;
    case GemmConfig::Coop128x256Cluster1x2:
      impl->backend = detail::make_grouped_gemm_coop128x256_c1x2(max_groups, device, sm_limit);
      break;
    case GemmConfig::Coop256x128Cluster2x1:
      impl->backend = detail::make_grouped_gemm_coop256x128_c2x1(max_groups, device, sm_limit);
      break;
    case GemmConfig::Coop256x128Cluster1x2:
      impl->backend = detail::make_grouped_gemm_coop256x128_c1x2(max_groups, device, sm_limit);
      break;
    case GemmConfig::Pingpong64x256Cluster1x2:
      impl->backend = detail::make_grouped_gemm_pingpong64x256_c1x2(max_groups, device, sm_limit);
      break;
  }
  if (!impl->backend) {
    throw_bad_input("grouped GEMM: unknown configuration " + std::to_string(int(config)));
  }
  impl_ = std::move(impl);
}

GroupedGemm::~GroupedGemm() {
  if (!impl_) return;
  // The backend frees device memory: do it on its device.
  int previous = 0;
  const bool switch_device = cudaGetDevice(&previous) == cudaSuccess && previous != impl_->device;
  if (switch_device) cudaSetDevice(impl_->device);
  impl_->backend.reset();
  if (switch_device) cudaSetDevice(previous);
}

void GroupedGemm::run(cudaStream_t stream, int groups, const int* row_offset_device,
                      const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* D, int N,
                      int K) {
  if (groups < 0 || groups > impl_->max_groups) {
    throw_bad_input("grouped GEMM: groups = " + std::to_string(groups) + " outside [0, " +
                    std::to_string(impl_->max_groups) + "] (max_groups)");
  }
  if (N <= 0 || N % 8 != 0) {
    throw_bad_input("grouped GEMM: N = " + std::to_string(N) +
                    " must be a positive multiple of 8");
  }
  if (K <= 0 || K % 8 != 0) {
    throw_bad_input("grouped GEMM: K = " + std::to_string(K) +
                    " must be a positive multiple of 8");
  }
  check_aligned(A, "A");
  check_aligned(B, "B");
  check_aligned(D, "D");
  if (groups == 0) return;  // nothing to compute, known without looking at the device
  if (row_offset_device == nullptr || A == nullptr || B == nullptr || D == nullptr) {
    throw_bad_input("grouped GEMM: row_offset, A, B and D must not be null");
  }
  if (reinterpret_cast<std::uintptr_t>(row_offset_device) % alignof(int) != 0) {
    throw_bad_input("grouped GEMM: row_offset must be int-aligned");
  }
  DeviceGuard guard(impl_->device);
  impl_->backend->run(stream, groups, row_offset_device, A, B, D, N, K);
}

GemmConfig GroupedGemm::config() const { return impl_->config; }

}  // namespace tilemoe::cuda
