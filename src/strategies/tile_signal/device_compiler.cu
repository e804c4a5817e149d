#include "device_compiler.hpp"

#include "strategies/sequential/device_counts.cuh"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

constexpr int kCompilerThreads = 1024;

// The counts and the sequential prefix sums (device_counts.cuh), the remote pairs' prefix sum
// with one warp, then every table a thread per entry.
__global__ void __launch_bounds__(kCompilerThreads) compile_tile_signal_kernel(const int* counts, int world, int experts, int* offset,
                                                                              int* rank_row, int* prefix,
                                                                              plan_detail::TileSignalShape shape, PlanTables* plan) {
  PlanTables tables = *plan;
  const plan_detail::StepCounts view =
      device_compile::counts_and_prefix(counts, nullptr, world, experts, offset, rank_row, prefix, shape.gemm);
  const int L = view.local_experts;
  if (threadIdx.x < 32) {
    device_compile::warp_exclusive_prefix(L, prefix + plan_detail::sequential_prefix_size(L), static_cast<int>(threadIdx.x),
                                          [&](int e) { return plan_detail::tile_signal_remote_pairs(view, shape.gemm, e); });
  }
  __syncthreads();
  plan_detail::compile_tile_signal_tables(view, shape, prefix, tables, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
  if (threadIdx.x == 0) *plan = tables;
}

}  // namespace

void launch_compile_tile_signal(cudaStream_t stream, const int* counts, const plan_detail::TileSignalShape& shape,
                                const DevicePlanTables& plan) {
  if (counts == nullptr) throw_internal("tile_signal device compiler: no counts");
  if (plan_detail::tile_signal_prefix_size(plan.experts() / plan.world()) > DevicePlanTables::prefix_room(plan.world(), plan.experts())) {
    throw_internal("tile_signal device compiler: the plan's prefix room is too small");
  }
  compile_tile_signal_kernel<<<1, kCompilerThreads, 0, stream>>>(counts, plan.world(), plan.experts(), plan.offset(), plan.rank_row(),
                                                                 plan.prefix(), shape, plan.view());
  TILEMOE_CUDA_CHECK_LAUNCH("tile_signal plan compiler");
}

}  // namespace tilemoe::cuda
