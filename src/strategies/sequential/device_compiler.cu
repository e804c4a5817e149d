#include "device_compiler.hpp"

#include "device_counts.cuh"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

using device_compile::kPrefixThreads;

// The counts and prefix sums (device_counts.cuh) on one CTA, into the plan's scratch.
__global__ void __launch_bounds__(kPrefixThreads) sequential_prefix_kernel(const int* counts, const int* offsets, int world,
                                                                          int experts, int* offset, int* rank_row, int* prefix,
                                                                          plan_detail::SequentialShape shape) {
  device_compile::counts_and_prefix(counts, offsets, nullptr, world, experts, offset, rank_row, prefix, shape);
}

}  // namespace

// The tables kernel's part: the sequential compiler at the layer's shape (outside the
// anonymous namespace: a kernel template's argument needs external linkage).
struct SequentialCompile {
  plan_detail::SequentialShape shape;
  __device__ void operator()(const plan_detail::StepCounts& counts, const int* prefix, PlanTables& tables, int lane, int lanes) const {
    plan_detail::compile_sequential_tables(counts, shape, prefix, tables, lane, lanes);
  }
};

void launch_compile_sequential(cudaStream_t stream, const int* counts, const int* offsets, const int* rank_tokens,
                               const plan_detail::SequentialShape& shape, const DevicePlanTables& plan) {
  if (counts == nullptr && offsets == nullptr) throw_internal("sequential device compiler: no counts");
  if ((rank_tokens != nullptr) != plan_detail::once_per_rank(shape)) throw_internal("sequential device compiler: rank token counts");
  sequential_prefix_kernel<<<1, kPrefixThreads, 0, stream>>>(counts, offsets, plan.world(), plan.experts(), plan.offset(),
                                                             plan.rank_row(), plan.prefix(), shape);
  TILEMOE_CUDA_CHECK_LAUNCH("sequential plan compiler (prefix sums)");
  device_compile::launch_plan_tables(stream, plan, rank_tokens, SequentialCompile{shape}, "sequential plan compiler (tables)");
}

}  // namespace tilemoe::cuda
