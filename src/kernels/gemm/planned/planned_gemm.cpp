// PlannedGemm: argument checks and dispatch to the instantiation of (cluster, epilogue).
#include "kernels/gemm/planned/planned_gemm.hpp"

#include <cstdint>
#include <string>

#include "core/cuda/current_device.hpp"
#include "tilemoe/cuda/cuda_check.hpp"
#include "kernels/gemm/planned/planned_gemm_backend.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

struct PlannedGemm::Backend {
  std::unique_ptr<detail::PlannedGemmBackend> impl;
};

namespace {

std::unique_ptr<detail::PlannedGemmBackend> make_backend(PlannedCluster cluster, PlannedEpilogue epilogue,
                                                         int max_groups, int device, int sm_limit) {
  using namespace detail;
  if (cluster == PlannedCluster::None) throw_bad_input("the planned GEMM runs on clusters of two CTAs only (c2x1 or c1x2)");
  if (cluster == PlannedCluster::M2) {
    switch (epilogue) {
      case PlannedEpilogue::Store: return make_planned_gemm_c2x1_store(max_groups, device, sm_limit);
      case PlannedEpilogue::SwiGLU: return make_planned_gemm_c2x1_swiglu(max_groups, device, sm_limit);
      case PlannedEpilogue::GELU: return make_planned_gemm_c2x1_gelu(max_groups, device, sm_limit);
    }
  } else {
    switch (epilogue) {
      case PlannedEpilogue::Store: return make_planned_gemm_c1x2_store(max_groups, device, sm_limit);
      case PlannedEpilogue::SwiGLU: return make_planned_gemm_c1x2_swiglu(max_groups, device, sm_limit);
      case PlannedEpilogue::GELU: return make_planned_gemm_c1x2_gelu(max_groups, device, sm_limit);
    }
  }
  throw_internal("planned GEMM: unknown cluster or epilogue");
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

const char* padding_mma_name(PaddingMma mode) {
  switch (mode) {
    case PaddingMma::Default: return "default";
    case PaddingMma::Issue: return "issue";
    case PaddingMma::SkipHalfTiles: return "skip-half";
    case PaddingMma::SkipAll: return "skip-all";
  }
  return "?";
}

const char* item_fetch_name(ItemFetch fetch) {
  switch (fetch) {
    case ItemFetch::Default: return "default";
    case ItemFetch::Static: return "static";
    case ItemFetch::Dynamic: return "dynamic";
  }
  return "?";
}

PlannedGemm::PlannedGemm(PlannedCluster cluster, PlannedEpilogue epilogue, int max_groups, int device, int sm_limit)
    : backend_(std::make_unique<Backend>()), cluster_(cluster), epilogue_(epilogue), max_groups_(max_groups) {
  if (max_groups <= 0) throw_bad_input("planned GEMM: max_groups must be positive");
  int major = 0, minor = 0;
  TILEMOE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TILEMOE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major != 9 || minor != 0) {
    throw_bad_input("planned GEMM: built for sm_90a (H100/H200); device " + std::to_string(device) + " is sm_" +
                    std::to_string(major) + std::to_string(minor));
  }
  use_device(device);
  backend_->impl = make_backend(cluster, epilogue, max_groups, device, sm_limit);
}

PlannedGemm::~PlannedGemm() = default;

void PlannedGemm::run(cudaStream_t stream, const PlannedGemmRun& r) {
  auto fail = [](const std::string& what) { throw_bad_input("planned GEMM: " + what); };
  if (r.groups <= 0 || r.groups > max_groups_) {
    fail(std::to_string(r.groups) + " groups (1.." + std::to_string(max_groups_) + " supported)");
  }
  if (r.N <= 0 || r.K <= 0 || r.N % 8 != 0 || r.K % 8 != 0) fail("N and K must be positive multiples of 8");
  if (epilogue_ == PlannedEpilogue::SwiGLU && r.N % 16 != 0) fail("SwiGLU needs N (2 x ffn) to be a multiple of 16");
  if (r.a_rows < 0) fail("a_rows must not be negative");
  if ((r.table == nullptr || r.count == nullptr) == (r.plan == nullptr)) fail("give a tile table and its count, or a plan");
  if (r.plan != nullptr && r.plan_layer != 0 && r.plan_layer != 1) fail("a plan's GEMM is layer 0 or 1");
  if (r.A == nullptr || r.B == nullptr || r.D == nullptr) fail("A, B and D are required");
  if (!aligned16(r.A) || !aligned16(r.B) || !aligned16(r.D)) fail("A, B and D must be 16-byte aligned");
  if (r.probe != nullptr && !aligned16(r.probe)) fail("the probe records must be 16-byte aligned");
  if (r.tile_waits.counter_flags > 0 && (r.plan == nullptr || r.tile_waits.epoch == nullptr || r.tile_waits.signals_per_count == 0 ||
                                         r.tile_waits.transport.rank < 0 || r.tile_waits.transport.rank >= r.tile_waits.transport.world)) {
    fail("tile waits need a plan, the step's epoch, a positive signals per count and the rank's transport");
  }
  backend_->impl->run(stream, r);
}

PlannedCluster PlannedGemm::cluster() const { return cluster_; }
PlannedEpilogue PlannedGemm::epilogue() const { return epilogue_; }
int PlannedGemm::grid_ctas() const { return backend_->impl->grid_ctas(); }

}  // namespace tilemoe::cuda
