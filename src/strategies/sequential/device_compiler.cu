#include "device_compiler.hpp"

#include "device_counts.cuh"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

using device_compile::kEntryThreads;
using device_compile::kPrefixThreads;

// The counts and prefix sums (device_counts.cuh) on one CTA, into the plan's scratch.
__global__ void __launch_bounds__(kPrefixThreads) sequential_prefix_kernel(const int* counts, const int* offsets, int world,
                                                                          int experts, int* offset, int* rank_row, int* prefix,
                                                                          plan_detail::SequentialShape shape) {
  device_compile::counts_and_prefix(counts, offsets, world, experts, offset, rank_row, prefix, shape);
}

// Every table a thread per entry over the whole grid; the first thread writes the header and
// the counts (`tables`: the pointers and room, by value, so no CTA reads what it writes).
__global__ void __launch_bounds__(kEntryThreads) sequential_tables_kernel(int world, int experts, const int* offset, const int* rank_row,
                                                                         const int* prefix, plan_detail::SequentialShape shape,
                                                                         PlanTables tables, PlanTables* plan) {
  const plan_detail::StepCounts view = device_compile::counts_view(world, experts, offset, rank_row);
  const int lane = device_compile::grid_lane(), lanes = device_compile::grid_lanes();
  plan_detail::compile_sequential_tables(view, shape, prefix, tables, lane, lanes);
  if (lane == 0) *plan = tables;
}

}  // namespace

void launch_compile_sequential(cudaStream_t stream, const int* counts, const int* offsets,
                               const plan_detail::SequentialShape& shape, const DevicePlanTables& plan) {
  if (counts == nullptr && offsets == nullptr) throw_internal("sequential device compiler: no counts");
  sequential_prefix_kernel<<<1, kPrefixThreads, 0, stream>>>(counts, offsets, plan.world(), plan.experts(), plan.offset(),
                                                             plan.rank_row(), plan.prefix(), shape);
  TILEMOE_CUDA_CHECK_LAUNCH("sequential plan compiler (prefix sums)");
  const int ctas = device_compile::entry_ctas(plan);
  sequential_tables_kernel<<<ctas, kEntryThreads, 0, stream>>>(plan.world(), plan.experts(), plan.offset(), plan.rank_row(),
                                                               plan.prefix(), shape, plan.empty_tables(), plan.view());
  TILEMOE_CUDA_CHECK_LAUNCH("sequential plan compiler (tables)");
}

}  // namespace tilemoe::cuda
