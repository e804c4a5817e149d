#include "device_compiler.hpp"

#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

constexpr int kCompilerThreads = 256;

// The offsets in parallel (a rank per thread), then the plan by one thread: a plan's entries
// depend on running counts of the entries before them (the first cut; a thread per entry is the
// next, as the planned GEMM's table builder decodes its entries).
__global__ void __launch_bounds__(kCompilerThreads) compile_sequential_kernel(const int* counts, const int* offsets, int world,
                                                                             int experts, int* offset, int* rank_row,
                                                                             plan_detail::SequentialShape shape, PlanTables* plan) {
  const int lane = static_cast<int>(threadIdx.x), lanes = static_cast<int>(blockDim.x);
  if (counts != nullptr) {
    plan_detail::derive_offsets(counts, world, experts, offset, lane, lanes);
  } else {
    for (int i = lane; i < world * (experts + 1); i += lanes) offset[i] = offsets[i];
  }
  __syncthreads();
  plan_detail::derive_rank_rows(offset, world, experts, rank_row, lane, lanes);
  __syncthreads();
  if (lane == 0) {
    const plan_detail::StepCounts view{world, experts, experts / world, offset, rank_row};
    PlanTables tables = *plan;
    plan_detail::compile_sequential_tables(view, shape, tables);
    *plan = tables;
  }
}

}  // namespace

void launch_compile_sequential(cudaStream_t stream, const int* counts, const int* offsets,
                               const plan_detail::SequentialShape& shape, const DevicePlanTables& plan) {
  if (counts == nullptr && offsets == nullptr) throw_internal("sequential device compiler: no counts");
  compile_sequential_kernel<<<1, kCompilerThreads, 0, stream>>>(counts, offsets, plan.world(), plan.experts(), plan.offset(),
                                                                plan.rank_row(), shape, plan.view());
  TILEMOE_CUDA_CHECK_LAUNCH("sequential plan compiler");
}

}  // namespace tilemoe::cuda
