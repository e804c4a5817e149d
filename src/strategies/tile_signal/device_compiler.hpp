#pragma once
// tile_signal's compiler on the GPU: tile_signal_plan.hpp's code path, right after the
// dispatch, from the counts the step has exchanged: the prefix sums on one CTA, then every
// table an entry per thread over a grid (as the sequential compiler).
#include <cuda_runtime.h>

#include "plan/device_plan_tables.hpp"
#include "tile_signal_plan.hpp"

namespace tilemoe::cuda {

// Every rank's counts as `counts` [world][experts] (the device dispatch's inbox), and with a
// dispatch once per destination rank `rank_tokens` [world][world] (else null). Writes `plan`'s
// tables for shape.gemm.rank.
void launch_compile_tile_signal(cudaStream_t stream, const int* counts, const int* rank_tokens, const plan_detail::TileSignalShape& shape,
                                const DevicePlanTables& plan);

}  // namespace tilemoe::cuda
