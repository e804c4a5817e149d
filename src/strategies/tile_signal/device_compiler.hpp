#pragma once
// tile_signal's compiler on the GPU: tile_signal_plan.hpp's code path in a one-CTA kernel of
// 1024 threads (an entry per thread), right after the dispatch, from the counts the step has
// exchanged.
#include <cuda_runtime.h>

#include "plan/device_plan_tables.hpp"
#include "tile_signal_plan.hpp"

namespace tilemoe::cuda {

// Every rank's counts as `counts` [world][experts] (the device dispatch's inbox). Writes
// `plan`'s tables for shape.gemm.rank.
void launch_compile_tile_signal(cudaStream_t stream, const int* counts, const plan_detail::TileSignalShape& shape,
                                const DevicePlanTables& plan);

}  // namespace tilemoe::cuda
