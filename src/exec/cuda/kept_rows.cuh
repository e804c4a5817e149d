#pragma once
// The grids that write, for each of a rank's routed rows, something at the row's destination
// (placement entries, input scales) take a thread per permuted row of the rank.
#include "comm/cuda/device_sync.cuh"
#include "plan/step_counts.hpp"

namespace tilemoe::cuda {

// This thread's kept permuted row of rank t.rank, or -1: rows past the kept ones hold the slots
// the capacity rule dropped, and a failing step's counts may be anything.
__device__ inline int kept_row_of_thread(const DeviceTransport& t, const plan_detail::StepCounts& c, int slots) {
  const int row = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  return row < slots && row < c.offset_of(t.rank, c.experts) && !transport_failed(t) ? row : -1;
}

}  // namespace tilemoe::cuda
