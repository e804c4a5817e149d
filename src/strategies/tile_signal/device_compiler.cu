#include "device_compiler.hpp"

#include "strategies/sequential/device_counts.cuh"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

using device_compile::kPrefixThreads;

// The counts and the sequential prefix sums (device_counts.cuh), then the remote pairs' prefix
// sum with one warp, on one CTA, into the plan's scratch.
__global__ void __launch_bounds__(kPrefixThreads) tile_signal_prefix_kernel(const int* counts, int world, int experts, int* offset,
                                                                           int* rank_row, int* prefix,
                                                                           plan_detail::TileSignalShape shape) {
  const plan_detail::StepCounts view =
      device_compile::counts_and_prefix(counts, nullptr, nullptr, world, experts, offset, rank_row, prefix, shape.gemm);
  const int L = view.local_experts;
  if (threadIdx.x < 32) {
    device_compile::warp_exclusive_prefix(L, prefix + plan_detail::sequential_prefix_size(L), static_cast<int>(threadIdx.x),
                                          [&](int e) { return plan_detail::tile_signal_remote_pairs(view, shape.gemm, e); });
  }
}

}  // namespace

// The tables kernel's part: tile_signal's compiler at the layer's shape (outside the anonymous
// namespace: a kernel template's argument needs external linkage).
struct TileSignalCompile {
  plan_detail::TileSignalShape shape;
  __device__ void operator()(const plan_detail::StepCounts& counts, const int* prefix, PlanTables& tables, int lane, int lanes) const {
    plan_detail::compile_tile_signal_tables(counts, shape, prefix, tables, lane, lanes);
  }
};

void launch_compile_tile_signal(cudaStream_t stream, const int* counts, const int* rank_tokens, const plan_detail::TileSignalShape& shape,
                                const DevicePlanTables& plan) {
  if (counts == nullptr) throw_internal("tile_signal device compiler: no counts");
  if ((rank_tokens != nullptr) != plan_detail::once_per_rank(shape.gemm)) throw_internal("tile_signal device compiler: rank token counts");
  if (plan_detail::tile_signal_prefix_size(plan.experts() / plan.world()) > DevicePlanTables::prefix_room(plan.world(), plan.experts())) {
    throw_internal("tile_signal device compiler: the plan's prefix room is too small");
  }
  tile_signal_prefix_kernel<<<1, kPrefixThreads, 0, stream>>>(counts, plan.world(), plan.experts(), plan.offset(), plan.rank_row(),
                                                              plan.prefix(), shape);
  TILEMOE_CUDA_CHECK_LAUNCH("tile_signal plan compiler (prefix sums)");
  device_compile::launch_plan_tables(stream, plan, rank_tokens, TileSignalCompile{shape}, "tile_signal plan compiler (tables)");
}

}  // namespace tilemoe::cuda
