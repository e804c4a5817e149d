#include "device_compiler.hpp"

#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

constexpr int kCompilerThreads = 256;

// The offsets a rank per thread, then the GEMM tiles (nearly all of a plan's entries) a tile per
// thread, each decoded from its index; thread 0 writes the rest (segments, waits, combines: a
// few per (rank, expert) pair) and the tables' counts.
__global__ void __launch_bounds__(kCompilerThreads) compile_sequential_kernel(const int* counts, const int* offsets, int world,
                                                                             int experts, int* offset, int* rank_row,
                                                                             plan_detail::SequentialShape shape, PlanTables* plan) {
  const int lane = static_cast<int>(threadIdx.x), lanes = static_cast<int>(blockDim.x);
  PlanTables tables = *plan;  // every thread's pointers and room; thread 0 writes the counts back at the end
  if (counts != nullptr) {
    plan_detail::derive_offsets(counts, world, experts, offset, lane, lanes);
  } else {
    for (int i = lane; i < world * (experts + 1); i += lanes) offset[i] = offsets[i];
  }
  __syncthreads();
  plan_detail::derive_rank_rows(offset, world, experts, rank_row, lane, lanes);
  __syncthreads();
  const plan_detail::StepCounts view{world, experts, experts / world, offset, rank_row};
  plan_detail::compile_sequential_tables(view, shape, tables, lane, lanes);
  if (lane == 0) *plan = tables;
}

}  // namespace

void launch_compile_sequential(cudaStream_t stream, const int* counts, const int* offsets,
                               const plan_detail::SequentialShape& shape, const DevicePlanTables& plan, int threads) {
  if (counts == nullptr && offsets == nullptr) throw_internal("sequential device compiler: no counts");
  if (threads < 1 || threads > kCompilerThreads) throw_internal("sequential device compiler: 1 to 256 threads");
  compile_sequential_kernel<<<1, threads, 0, stream>>>(counts, offsets, plan.world(), plan.experts(), plan.offset(),
                                                                plan.rank_row(), shape, plan.view());
  TILEMOE_CUDA_CHECK_LAUNCH("sequential plan compiler");
}

}  // namespace tilemoe::cuda
