#pragma once
// The band consumer: a persistent kernel on its own CTAs (and stream) that takes the bands of a
// list (plan/gpu_tables.hpp) in segments of `bands_per_segment`, in list order, waits for each
// band's ready flag (raised by GEMM1's tiles), and stores the band's rows into each row's
// source rank's returned_rows, exactly where the sequential combine send puts them; after each
// segment a warp raises the row-arrival flag of every row it stored (EpRegionLayout::
// row_arrivals, at the row's source). It decides nothing: the order and the segments are the
// list's (tile_signal's gpu_schedule builds it).
#include <cuda_runtime.h>

#include "exec/cuda/ep_exchange.hpp"
#include "plan/gpu_tables.hpp"

namespace tilemoe::cuda {

struct BandConsumerArgs {
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

// The epoch is the step's (launch_ep_begin_step ran before, in stream order).
void launch_band_consumer(cudaStream_t stream, const DeviceTransport& transport, const BandConsumerArgs& args);

}  // namespace tilemoe::cuda
