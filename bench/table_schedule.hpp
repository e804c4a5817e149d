#pragma once
// tile_signal's schedule as the GPU built it before it compiled plans: GEMM1's tile table
// reordered remote-first, and the band list, by kernels right after the dispatch. Kept for the
// benchmarks that weigh against it: device_plan_bench (the compile against these builds) and
// signal_cost_bench (the flags' cost in that order). The layer runs tile_signal_plan.hpp's plan.
//  - GEMM1's tile table (the sequential table of build_tile_table, in band blocks) reordered so
//    that the cluster items of bands holding other ranks' rows come first, stably;
//  - the bands in the same remote-first order.
#include <cuda_runtime.h>

#include <cstdint>

#include "strategies/tile_signal/band_order.hpp"
#include "plan/gpu_tables.hpp"

namespace tilemoe::cuda {

// Bands of `groups` groups with offsets row_offset [groups + 1] (device), in remote-first
// order (stable): bands[0 .. *count). `block_offset` [groups * world + 1] splits each group's
// rows by source rank (EpLocalTables). Capacity as max_bands().
std::int64_t max_bands(std::int64_t rows, int groups);
void launch_build_bands(cudaStream_t stream, const int* row_offset, const int* block_offset, int groups, int world, int me,
                        TileBand* bands, int capacity, int* count);

// Reorders the GEMM1 table (entries [0, *count), cluster items of `cluster_size` entries kept
// together) so that the items of remote bands come first, stably; `scratch` has the table's room.
void launch_order_remote_first(cudaStream_t stream, GemmTileEntry* table, const int* count, int cluster_size,
                               const int* block_offset, int groups, int world, int me, GemmTileEntry* scratch);

}  // namespace tilemoe::cuda
