#pragma once
// The band consumer: a persistent kernel on its own CTAs (and stream) that walks a plan's
// segments from `first_segment` on, in units of `segments_per_unit` consecutive segments that
// share their waits (the strategy compiles them so: tile_signal's pieces of bands_per_segment
// bands). For each unit it waits for the unit's flags (raised by GEMM1's tiles into `flags`),
// then stores every segment's rows (ExpertOut rows) into its destination rank's returned rows at
// the segment's CombineIn rows, and raises each row's arrival flag there at the step's epoch
// (EpRegionLayout::row_arrivals: a CombineIn row's flag, as the plan's flag_per_row says). It
// decides nothing: the order, the units and the destinations are the plan's.
#include <cuda_runtime.h>

#include "exec/cuda/ep_exchange.hpp"
#include "tilemoe/plan.hpp"

namespace tilemoe::cuda {

struct BandConsumerArgs {
  EpExchangeArgs exchange;           // layout, tables, hidden, silent; expert_out = GEMM1's output
  const PlanTables* plan = nullptr;  // device: the step's plan
  int first_segment = 0;             // the consumer's segments are [first_segment, segments.count)
  int segments_per_unit = 1;         // consecutive segments that share their waits
  const unsigned* flags = nullptr;   // GEMM1's flags, zeroed before this step's GEMM1 (the plan's
                                     // flags differ from step to step, so no cumulative target)
  int flag_offset = 0;               // the plan's flag f is flags[f - flag_offset]
  int ctas = 0;                      // the consumer's CTAs (same on every rank)
  unsigned long long* unit_times = nullptr;  // optional [3 * units]: %globaltimer at the unit's
                                             // start, flags ready, rows shipped
};

// The epoch is the step's (launch_ep_begin_step ran before, in stream order).
void launch_band_consumer(cudaStream_t stream, const DeviceTransport& transport, const BandConsumerArgs& args);

}  // namespace tilemoe::cuda
