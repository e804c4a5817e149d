#pragma once
// CUTLASS 4.2 sm90 grouped bf16 GEMM, one instantiation per (tile shape, cluster shape).
// Include from exactly one .cu per configuration (grouped_gemm_<config>.cu): each instantiation
// costs about a minute of compile time. Model: CUTLASS examples/57_hopper_grouped_gemm, with the
// problem shapes only on the device (host shapes = nullptr), so the grid is the persistent
// sm_count-sized one and no host sync is needed.
//
// Per run: a one-thread-per-group setup kernel turns row_offset into shapes, pointers and strides
// in device arrays whose addresses never change, then the grouped GEMM is launched. The CUTLASS
// Params (TMA descriptor templates, scheduler parameters) depend only on those addresses, the
// hardware info, the workspace and the group count, so Gemm::initialize() runs in the
// constructor and again only when the group count differs from the previous run.
//
// Not re-entrant across streams: the device arrays and the workspace (per-SM TMA descriptors,
// rewritten by the kernel itself) belong to the object, so two runs of one object must be
// ordered (same stream, or event-ordered). Use one object per concurrent stream.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

// CUTLASS's sm100 collectives (pulled in by the builders) capture `this` implicitly in lambdas,
// which C++20 deprecates (nvcc warning 2908); they are not ours to fix.
#pragma nv_diag_suppress 2908
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"
#include "cutlass/util/packed_stride.hpp"
#pragma nv_diag_default 2908
#include "tilemoe/cuda/cuda_check.hpp"
#include "kernels/gemm/stock/grouped_gemm_configs.hpp"
#include "tilemoe/error.hpp"

#if !defined(CUTLASS_ARCH_MMA_MODIFIABLE_TMA_SM90_SUPPORTED)
#error "grouped GEMM needs CUDA >= 12.3 (CUTLASS_ARCH_MMA_MODIFIABLE_TMA_SM90_SUPPORTED)"
#endif
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "compile the grouped GEMM for sm_90a (-gencode arch=compute_90a,code=sm_90a), not sm_90"
#endif

namespace tilemoe::cuda::detail {

inline void check_cutlass(cutlass::Status status, const char* call, const char* file, int line) {
  if (status == cutlass::Status::kSuccess) return;
  std::string message = std::string("CUTLASS call ") + call + " failed: " +
                        cutlass::cutlassGetStatusString(status);
  const cudaError_t err = cudaGetLastError();  // the launch error behind it, if any (clears it)
  if (err != cudaSuccess) {
    message += std::string(" (CUDA: ") + cudaGetErrorName(err) + ", " + cudaGetErrorString(err) + ")";
  }
  throw_internal(message + " at " + file + ":" + std::to_string(line));
}

#define TILEMOE_CUTLASS_CHECK(call) \
  ::tilemoe::cuda::detail::check_cutlass((call), #call, __FILE__, __LINE__)

// The CUTLASS types of one configuration. A RowMajor [M][K], B ColumnMajor (stored [N][K]),
// D RowMajor [M][N], no C; bf16 operands, fp32 accumulation and epilogue compute.
// Cooperative: both consumer warp groups share one tile (tile M >= 128). Pingpong: each warp
// group owns a tile, so one tile's epilogue overlaps the other's MMAs (tile M = 64 possible).
template <class TileShape_, class ClusterShape_, bool kPingpong = false>
struct GroupedGemmTypes {
  using KernelSchedule = std::conditional_t<kPingpong, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
                                            cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>;
  using EpilogueSchedule = std::conditional_t<kPingpong, cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong,
                                              cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
  using TileShape = TileShape_;
  using ClusterShape = ClusterShape_;

  using ElementA = cutlass::bfloat16_t;
  using ElementB = cutlass::bfloat16_t;
  using ElementD = cutlass::bfloat16_t;
  using ElementAccumulator = float;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignment = 8;  // elements: 16 bytes of bf16, the TMA minimum

  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;  // (M,N,K)
  using GroupShape = typename ProblemShape::UnderlyingProblemShape;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator,
      void, LayoutD*, kAlignment,  // C = void: no source load, beta must be 0
      ElementD, LayoutD*, kAlignment, EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, ElementAccumulator>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA*, kAlignment,
      ElementB, LayoutB*, kAlignment, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using Arguments = typename Gemm::Arguments;

  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideD = typename GemmKernel::InternalStrideD;

  // All three are (leading dimension, 1, 0) with the leading dimension set at run time: A's is K,
  // B's (as [N][K]) is K, D's is N. The setup kernel relies on that.
  using PackedGroupStride = cute::Stride<int64_t, cute::Int<1>, cute::Int<0>>;
  static_assert(std::is_same_v<StrideA, PackedGroupStride>, "unexpected CUTLASS stride for A");
  static_assert(std::is_same_v<StrideB, PackedGroupStride>, "unexpected CUTLASS stride for B");
  static_assert(std::is_same_v<StrideD, PackedGroupStride>, "unexpected CUTLASS stride for D");
  static_assert(std::is_same_v<GroupShape, cute::Shape<int, int, int>>);
  static_assert(sizeof(ElementA) == sizeof(__nv_bfloat16) && alignof(ElementA) == alignof(__nv_bfloat16));

  static constexpr int kClusterSize = int(cute::size(ClusterShape{}));
};

// One thread per group: M_g from row_offset, then shape, pointers and packed strides.
// A group with a negative start or a negative M (malformed row_offset) gets M = 0 and is skipped
// by the GEMM instead of faulting; row_offset must otherwise be non-decreasing from 0.
template <class GroupShape, class Stride>
__global__ void grouped_gemm_setup_kernel(int groups, const int* __restrict__ row_offset,
                                          const cutlass::bfloat16_t* A, const cutlass::bfloat16_t* B,
                                          cutlass::bfloat16_t* D, int N, int K, GroupShape* shapes,
                                          const cutlass::bfloat16_t** ptr_A,
                                          const cutlass::bfloat16_t** ptr_B,
                                          cutlass::bfloat16_t** ptr_D, Stride* stride_A,
                                          Stride* stride_B, Stride* stride_D) {
  const int g = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (g >= groups) return;
  int begin = row_offset[g];
  int m = row_offset[g + 1] - begin;
  if (begin < 0 || m < 0) {
    begin = 0;
    m = 0;
  }
  shapes[g] = cute::make_shape(m, N, K);
  ptr_A[g] = A + int64_t(begin) * K;
  ptr_B[g] = B + int64_t(g) * N * K;
  ptr_D[g] = D + int64_t(begin) * N;
  stride_A[g] = cutlass::make_cute_packed_stride(Stride{}, cute::make_shape(m, K, 1));
  stride_B[g] = cutlass::make_cute_packed_stride(Stride{}, cute::make_shape(N, K, 1));
  stride_D[g] = cutlass::make_cute_packed_stride(Stride{}, cute::make_shape(m, N, 1));
}

template <class T>
T* device_alloc(std::size_t count, const char* what) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, std::max<std::size_t>(count * sizeof(T), 1));
  if (err != cudaSuccess) throw_cuda_error(err, what, __FILE__, __LINE__);
  return static_cast<T*>(p);
}

template <class TileShape, class ClusterShape, bool kPingpong = false>
class CutlassGroupedGemm final : public GroupedGemmBackend {
  using Types = GroupedGemmTypes<TileShape, ClusterShape, kPingpong>;
  using Gemm = typename Types::Gemm;
  using GemmKernel = typename Types::GemmKernel;
  using Arguments = typename Types::Arguments;
  using GroupShape = typename Types::GroupShape;
  using Stride = typename Types::PackedGroupStride;
  using Element = cutlass::bfloat16_t;

 public:
  CutlassGroupedGemm(int max_groups, int device, int sm_limit)
      : max_groups_(max_groups), device_(device) {
    try {
      init(sm_limit);
    } catch (...) {
      release();
      throw;
    }
  }

  ~CutlassGroupedGemm() override { release(); }

  CutlassGroupedGemm(const CutlassGroupedGemm&) = delete;
  CutlassGroupedGemm& operator=(const CutlassGroupedGemm&) = delete;

  void run(cudaStream_t stream, int groups, const int* row_offset_device, const __nv_bfloat16* A,
           const __nv_bfloat16* B, __nv_bfloat16* D, int N, int K) override {
    constexpr int kThreads = 128;
    grouped_gemm_setup_kernel<GroupShape, Stride><<<(groups + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        groups, row_offset_device, reinterpret_cast<const Element*>(A),
        reinterpret_cast<const Element*>(B), reinterpret_cast<Element*>(D), N, K, shapes_, ptr_A_,
        ptr_B_, ptr_D_, stride_A_, stride_B_, stride_D_);
    TILEMOE_CUDA_CHECK_LAUNCH("grouped_gemm_setup_kernel<<<>>>");
    if (groups != params_groups_) {
      // Host-side only (3 TMA descriptor encodes + a function attribute): needed only because
      // the group count is part of the kernel parameters.
      TILEMOE_CUTLASS_CHECK(gemm_.initialize(arguments(groups), workspace_, stream));
      params_groups_ = groups;
    }
    TILEMOE_CUTLASS_CHECK(gemm_.run(stream));
  }

 private:
  void init(int sm_limit) {
    const void* kernel = reinterpret_cast<const void*>(&cutlass::device_kernel<GemmKernel>);
    const int smem_bytes = int(GemmKernel::SharedStorageSize);
    TILEMOE_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));

    int sms = 0;
    TILEMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_));

    // Clusters that fit at once, asked with the real dynamic smem size (CUTLASS's own query in
    // make_kernel_hardware_info passes 0 bytes).
    cudaLaunchAttribute cluster_attr{};
    cluster_attr.id = cudaLaunchAttributeClusterDimension;
    cluster_attr.val.clusterDim.x = unsigned(cute::size<0>(ClusterShape{}));
    cluster_attr.val.clusterDim.y = unsigned(cute::size<1>(ClusterShape{}));
    cluster_attr.val.clusterDim.z = unsigned(cute::size<2>(ClusterShape{}));
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(cluster_attr.val.clusterDim.x, cluster_attr.val.clusterDim.y,
                          cluster_attr.val.clusterDim.z);
    config.blockDim = dim3(GemmKernel::MaxThreadsPerBlock, 1, 1);
    config.dynamicSmemBytes = std::size_t(smem_bytes);
    config.attrs = &cluster_attr;
    config.numAttrs = 1;
    int max_clusters = 0;
    TILEMOE_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&max_clusters, kernel, &config));
    if (max_clusters <= 0) {
      throw_internal("grouped GEMM: no cluster of " + std::to_string(Types::kClusterSize) +
                     " CTAs with " + std::to_string(smem_bytes) +
                     " bytes of shared memory fits on device " + std::to_string(device_));
    }

    int sm_count = sms;
    if (sm_limit > 0) sm_count = std::min(sm_limit, sms);
    const int clusters = std::min(max_clusters, sm_count / Types::kClusterSize);
    if (clusters <= 0) {
      throw_bad_input("grouped GEMM: sm_limit " + std::to_string(sm_limit) +
                      " is smaller than the cluster size " + std::to_string(Types::kClusterSize));
    }
    // Both set: the grid is then exactly clusters * cluster size CTAs (CUTLASS guide, 3.4).
    hw_info_ = cutlass::KernelHardwareInfo::make_kernel_hardware_info<GemmKernel>(device_, sm_count,
                                                                                  clusters);

    shapes_ = device_alloc<GroupShape>(max_groups_, "cudaMalloc(problem shapes)");
    ptr_A_ = device_alloc<const Element*>(max_groups_, "cudaMalloc(ptr_A)");
    ptr_B_ = device_alloc<const Element*>(max_groups_, "cudaMalloc(ptr_B)");
    ptr_D_ = device_alloc<Element*>(max_groups_, "cudaMalloc(ptr_D)");
    stride_A_ = device_alloc<Stride>(max_groups_, "cudaMalloc(stride_A)");
    stride_B_ = device_alloc<Stride>(max_groups_, "cudaMalloc(stride_B)");
    stride_D_ = device_alloc<Stride>(max_groups_, "cudaMalloc(stride_D)");

    // The workspace (per-SM TMA descriptors) depends on sm_count only, not on the group count.
    const Arguments args = arguments(max_groups_);
    const std::size_t workspace_bytes = Gemm::get_workspace_size(args);
    workspace_ = device_alloc<std::uint8_t>(workspace_bytes, "cudaMalloc(workspace)");
    TILEMOE_CUTLASS_CHECK(Gemm::can_implement(args));
    TILEMOE_CUTLASS_CHECK(gemm_.initialize(args, workspace_, nullptr));
    params_groups_ = max_groups_;
  }

  Arguments arguments(int groups) const {
    Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = {groups, shapes_, nullptr};  // shapes only on the device
    args.mainloop.ptr_A = ptr_A_;
    args.mainloop.dA = stride_A_;
    args.mainloop.ptr_B = ptr_B_;
    args.mainloop.dB = stride_B_;
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = nullptr;
    args.epilogue.ptr_D = ptr_D_;
    args.epilogue.dD = stride_D_;
    args.hw_info = hw_info_;
    return args;
  }

  void release() noexcept {
    // No throwing from here; a failure to free leaks at worst.
    cudaFree(shapes_);
    cudaFree(ptr_A_);
    cudaFree(ptr_B_);
    cudaFree(ptr_D_);
    cudaFree(stride_A_);
    cudaFree(stride_B_);
    cudaFree(stride_D_);
    cudaFree(workspace_);
    shapes_ = nullptr;
    ptr_A_ = ptr_B_ = nullptr;
    ptr_D_ = nullptr;
    stride_A_ = stride_B_ = stride_D_ = nullptr;
    workspace_ = nullptr;
  }

  int max_groups_;
  int device_;
  cutlass::KernelHardwareInfo hw_info_{};
  GroupShape* shapes_ = nullptr;
  const Element** ptr_A_ = nullptr;
  const Element** ptr_B_ = nullptr;
  Element** ptr_D_ = nullptr;
  Stride* stride_A_ = nullptr;
  Stride* stride_B_ = nullptr;
  Stride* stride_D_ = nullptr;
  std::uint8_t* workspace_ = nullptr;
  Gemm gemm_;
  int params_groups_ = -1;  // group count the adapter's Params were built for
};

}  // namespace tilemoe::cuda::detail
