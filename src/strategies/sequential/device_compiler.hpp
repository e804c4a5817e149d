#pragma once
// The sequential strategy's compiler on the GPU: sequential_plan.hpp's code path in a one-CTA
// kernel of 1024 threads (an entry per thread), right after the dispatch, from the counts the
// step has exchanged.
#include <cuda_runtime.h>

#include "plan/device_plan_tables.hpp"
#include "sequential_plan.hpp"

namespace tilemoe::cuda {

// Every rank's counts come either as `counts` [world][experts] (the device dispatch's inbox) or,
// when `counts` is null, as `offsets` [world][experts + 1] (the host path's gathered layouts, a
// world of one's own). Writes `plan`'s tables for shape.rank.
void launch_compile_sequential(cudaStream_t stream, const int* counts, const int* offsets,
                               const plan_detail::SequentialShape& shape, const DevicePlanTables& plan);

}  // namespace tilemoe::cuda
