#pragma once
// The sequential strategy's compiler on the GPU: sequential_plan.hpp's code path, right after
// the dispatch, from the counts the step has exchanged, in two kernels: the prefix sums on one
// CTA (device_counts.cuh), then every table an entry per thread over a grid (one CTA for all
// entries was 3-5x slower than the table builds it replaced: BENCHMARKS.md, fifth cut).
#include <cuda_runtime.h>

#include "plan/device_plan_tables.hpp"
#include "sequential_plan.hpp"

namespace tilemoe::cuda {

// Every rank's counts come either as `counts` [world][experts] (the device dispatch's inbox) or,
// when `counts` is null, as `offsets` [world][experts + 1] (the host path's gathered layouts, a
// world of one's own). `rank_tokens` [world][world] (StepCounts::rank_tokens, the exchange's
// inbox) with a dispatch once per destination rank, else null. Writes `plan`'s tables for
// shape.rank.
void launch_compile_sequential(cudaStream_t stream, const int* counts, const int* offsets, const int* rank_tokens,
                               const plan_detail::SequentialShape& shape, const DevicePlanTables& plan);

}  // namespace tilemoe::cuda
