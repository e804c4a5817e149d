#pragma once
// tile_signal's schedule on the GPU (ICPP 2026; systems.md section 1), built on the device right
// after the dispatch has written the step's tables, with no host synchronisation (the host twin,
// which the CPU engine's plan and the GPU tests use, is band_order.hpp's tile_signal_tables):
//  - GEMM1's tile table (the sequential table of build_tile_table, in band blocks) reordered so
//    that the cluster items of bands holding other ranks' rows come first, stably;
//  - the bands in the same remote-first order, which the band consumer (exec/cuda) ships in
//    segments of bands_per_segment as their flags complete;
// The rows, the GEMM configuration and the destinations are those of the sequential step, so
// the combine input, and with it the output, is bitwise the same.
#include <cuda_runtime.h>

#include <cstdint>

#include "band_order.hpp"
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
