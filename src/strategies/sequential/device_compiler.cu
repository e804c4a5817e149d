#include "device_compiler.hpp"

#include "device_counts.cuh"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

constexpr int kCompilerThreads = 1024;

// The counts and prefix sums (device_counts.cuh), then every table a thread per entry.
__global__ void __launch_bounds__(kCompilerThreads) compile_sequential_kernel(const int* counts, const int* offsets, int world,
                                                                             int experts, int* offset, int* rank_row, int* prefix,
                                                                             plan_detail::SequentialShape shape, PlanTables* plan) {
  PlanTables tables = *plan;  // every thread's pointers and room; thread 0 writes the counts back at the end
  const plan_detail::StepCounts view =
      device_compile::counts_and_prefix(counts, offsets, world, experts, offset, rank_row, prefix, shape);
  plan_detail::compile_sequential_tables(view, shape, prefix, tables, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
  if (threadIdx.x == 0) *plan = tables;
}

}  // namespace

void launch_compile_sequential(cudaStream_t stream, const int* counts, const int* offsets,
                               const plan_detail::SequentialShape& shape, const DevicePlanTables& plan) {
  if (counts == nullptr && offsets == nullptr) throw_internal("sequential device compiler: no counts");
  compile_sequential_kernel<<<1, kCompilerThreads, 0, stream>>>(counts, offsets, plan.world(), plan.experts(), plan.offset(),
                                                                plan.rank_row(), plan.prefix(), shape, plan.view());
  TILEMOE_CUDA_CHECK_LAUNCH("sequential plan compiler");
}

}  // namespace tilemoe::cuda
