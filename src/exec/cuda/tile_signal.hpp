#pragma once
// The tile-signal combine overlap on the GPU (ICPP 2026; systems.md section 1), on top of the
// expert-parallel layer's exchange (ep_exchange.hpp):
//  - producer: GEMM1 is the planned GEMM over all local experts with one ready flag per row
//    band (128 rows x all hidden columns: the flag reaches the band's column-tile count per
//    step), its tile table reordered so that bands holding rows of other ranks come first, and
//    run on all SMs but the consumer's;
//  - consumer: a persistent kernel on `ctas` CTAs (its own stream) that takes segments of
//    `bands_per_segment` bands in the same remote-first order, waits for their flags, and
//    stores their rows into each row's source rank's returned_rows, exactly where the
//    sequential combine send puts them; after each segment a warp raises the row-arrival
//    flag of every row it stored (EpRegionLayout::row_arrivals, at the row's source);
//  - combine: the owner's combine, launched right after its GEMM1, combines each of its tokens
//    as soon as the token's k rows have landed (their arrival flags at the step's epoch), on a
//    persistent grid that never waits for the whole exchange.
// The rows, the GEMM configuration and the destinations are those of the sequential step, so
// the combine input, and with it the output, is bitwise the same.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "exec/cuda/ep_exchange.hpp"
#include "exec/cuda/planned_gemm.hpp"

namespace tilemoe::cuda {

// A row band of the local experts' rows: [row_begin, row_begin + rows), rows <= 128.
struct TileBand {
  std::int32_t row_begin = 0;
  std::int32_t rows = 0;
  std::int32_t remote = 0;  // holds rows of another rank (shipped first)
  std::int32_t id = 0;      // its flag: bands numbered in row order, as TileFlags::PerBand does
  std::int32_t group = 0;   // the local expert
};

// Whether rows [lo, hi) of local expert g hold rows of a rank other than `me`, by the split of
// its rows by source, block_offset [groups * world + 1] (EpLocalTables). Host and device.
__host__ __device__ inline bool holds_remote_rows(const int* block_offset, int g, int world, int me, int lo, int hi) {
  for (int q = 0; q < world; ++q) {
    if (q == me) continue;
    const int b = block_offset[g * world + q], e = block_offset[g * world + q + 1];
    if (b < e && lo < e && b < hi) return true;
  }
  return false;
}

// Bands of `groups` groups with offsets row_offset [groups + 1] (device), in remote-first
// order (stable): bands[0 .. *count). `block_offset` [groups * world + 1] splits each group's
// rows by source rank (EpLocalTables). Capacity as max_bands().
std::int64_t max_bands(std::int64_t rows, int groups);
void launch_build_bands(cudaStream_t stream, const int* row_offset, const int* block_offset, int groups, int world, int me,
                        TileBand* bands, int capacity, int* count);

// The band block of GEMM1's table (build_tile_table) when none is given: a band is ready after
// all its column tiles, which the sequential order (bands fastest, one column pair after the
// other) finishes near the end of its expert; blocks of about two waves of GEMM1's 2-CTA
// clusters (each item is half a band's column tiles) make bands ready one block at a time.
inline int default_band_block(int gemm1_sms, int column_tiles) {
  const int clusters = gemm1_sms / 2 > 1 ? gemm1_sms / 2 : 1;
  const int wanted = (4 * clusters + column_tiles - 1) / column_tiles;
  return wanted <= 2 ? 2 : (wanted + 1) / 2 * 2;
}

// Reorders the GEMM1 table (entries [0, *count), cluster items of `cluster_size` entries kept
// together) so that the items of remote bands come first, stably; `scratch` has the table's room.
void launch_order_remote_first(cudaStream_t stream, GemmTileEntry* table, const int* count, int cluster_size,
                               const int* block_offset, int groups, int world, int me, GemmTileEntry* scratch);

struct TileSignalArgs {
  EpExchangeArgs exchange;                 // layout, tables, experts, hidden, silent; expert_out = GEMM1's output
  const TileBand* bands = nullptr;         // remote-first
  const int* band_count = nullptr;
  const unsigned* flags = nullptr;         // GEMM1's per-band flags, zeroed before this step's GEMM1
                                           // (the bands differ from step to step, so no cumulative target)
  unsigned tiles_per_band = 0;             // column tiles of GEMM1 (ceil(hidden / 256))
  int ctas = 0;                            // the consumer's CTAs (same on every rank)
  int bands_per_segment = 1;               // mgb
  unsigned long long* segment_times = nullptr;  // optional [3 * segments]: %globaltimer at the
                                                // segment's start, flags ready, rows shipped
};

// The consumer; the epoch is the step's (ep begin step ran before, in stream order).
void launch_tile_signal_consumer(cudaStream_t stream, const DeviceTransport& transport, const TileSignalArgs& args);

struct ArrivalCombineArgs {
  const std::uint64_t* epoch = nullptr;  // this step's (device)
  std::size_t returned_rows = 0;         // region offsets (EpRegionLayout)
  std::size_t row_arrivals = 0;
  const std::int32_t* expert = nullptr;  // [tokens * top_k] the router's choices (a row's source rank)
  const float* weight = nullptr;         // [tokens * top_k]
  const int* row_of_slot = nullptr;      // [tokens * top_k] where each slot's row returns
  int tokens = 0, top_k = 0, hidden = 0, local_experts = 1;
  int ctas = 1;                          // the persistent grid: all of them may wait at once
  __nv_bfloat16* output = nullptr;       // [tokens][hidden]
};

// The owner's combine, token by token as rows land; bitwise the sequential combine's output.
void launch_arrival_combine(cudaStream_t stream, const DeviceTransport& transport, const ArrivalCombineArgs& args);
// Its resident CTAs per SM, for sizing a grid that fits beside the other ranks' waiting kernels.
int arrival_combine_ctas_per_sm();

}  // namespace tilemoe::cuda
