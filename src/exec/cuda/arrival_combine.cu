#include "arrival_combine.hpp"

#include <algorithm>

#include "comm/cuda/device_sync.cuh"
#include "kernels/combine_vector.cuh"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

constexpr int kArrivalCombineThreads = 256;

// The owner's combine: token after token (a persistent grid, tokens strided over its CTAs),
// each as soon as its k returned rows have landed, in top-k slot order as the sequential combine.
__global__ void __launch_bounds__(kArrivalCombineThreads) arrival_combine_kernel(DeviceTransport t, ArrivalCombineArgs a) {
  const std::uint64_t epoch = *a.epoch;
  const std::uint64_t* arrivals = region_at<std::uint64_t>(t, t.rank, a.row_arrivals);
  const auto* rows = region_at<__nv_bfloat16>(t, t.rank, a.returned_rows);
  const int tid = static_cast<int>(threadIdx.x), k = a.top_k, vectors = a.hidden / 8;
  // a failing step combines nothing (every thread reaches the same verdict by the barrier's or)
  if (__syncthreads_or(tid == 0 && transport_failed(t))) return;
  for (int token = static_cast<int>(blockIdx.x); token < a.tokens; token += static_cast<int>(gridDim.x)) {
    int failed = 0;
    for (int j = tid; j < k && !failed; j += kArrivalCombineThreads) {
      const int slot = token * k + j, row = a.row_of_slot[slot];
      if (row < 0) continue;  // dropped by the capacity rule: no row comes back
      const int source = a.expert[slot] / a.local_experts;  // whose consumer ships the row
      failed = !wait_at_least(t, arrivals + row, epoch, source, comm::WaitSubject::CombineRows, epoch);
    }
    if (__syncthreads_or(failed)) return;  // the barrier also extends the flags' acquire to the CTA
    for (int v = tid; v < vectors; v += kArrivalCombineThreads) {
      reinterpret_cast<uint4*>(a.output + static_cast<std::size_t>(token) * a.hidden)[v] =
          combine_vector(rows, a.weight, a.row_of_slot, token, k, a.hidden, v);
    }
  }
}

}  // namespace

int arrival_combine_ctas_per_sm() {
  int blocks = 0;
  TILEMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, arrival_combine_kernel, kArrivalCombineThreads, 0));
  return blocks;
}

void launch_arrival_combine(cudaStream_t stream, const DeviceTransport& t, const ArrivalCombineArgs& a) {
  if (a.tokens == 0) return;
  if (a.ctas < 1 || a.local_experts < 1 || a.top_k < 1 || a.hidden % 8 != 0) throw_internal("arrival combine: bad arguments");
  // no more CTAs than tokens (a decode step has fewer tokens than the grid has room for)
  arrival_combine_kernel<<<std::min(a.ctas, a.tokens), kArrivalCombineThreads, 0, stream>>>(t, a);
  TILEMOE_CUDA_CHECK_LAUNCH("arrival combine");
}

}  // namespace tilemoe::cuda
