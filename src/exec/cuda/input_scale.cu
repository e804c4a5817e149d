#include "input_scale.hpp"

#include <cuda_bf16.h>

#include <algorithm>

#include "comm/cuda/device_sync.cuh"
#include "exec/cuda/kept_rows.cuh"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

constexpr int kScaleThreads = 256;

__global__ void __launch_bounds__(kScaleThreads) write_scales_kernel(DeviceTransport t, InputScaleArgs a) {
  const plan_detail::StepCounts& c = a.counts;
  const int me = t.rank, row = kept_row_of_thread(t, c, a.tokens * a.top_k);
  if (row < 0) return;
  const int slot = a.slot_of_row[row], x = a.expert[slot], d = x / c.local_experts;
  const std::int64_t entry = plan_detail::expert_in_row(c, a.order, me, x, row);
  if (entry < 0 || entry >= a.row_bound) return;  // counts past the room: the step is failing (counts kernel)
  region_at<float>(t, d, a.layout.expert_in_scale)[entry] = a.weight[slot];
  if (d != me) __threadfence_system();  // before the dispatch's release of the row (a later kernel)
}

// A warp per row, eight bf16 values per lane and step.
__global__ void __launch_bounds__(kScaleThreads) scale_rows_kernel(DeviceTransport t, InputScaleArgs a) {
  const int rows = min(static_cast<std::int64_t>(*a.expert_rows), a.row_bound);
  const float* scale = region_at<float>(t, t.rank, a.layout.expert_in_scale);
  auto* data = region_at<uint4>(t, t.rank, a.layout.dispatch_rows);
  const int vectors = a.hidden / 8, lane = static_cast<int>(threadIdx.x % 32);
  const int warps = static_cast<int>(gridDim.x * blockDim.x / 32);
  for (int r = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / 32); r < rows; r += warps) {
    const float s = scale[r];
    uint4* row = data + static_cast<std::size_t>(r) * vectors;
    for (int v = lane; v < vectors; v += 32) {
      uint4 packed = row[v];
      __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&packed);
      for (int q = 0; q < 4; ++q) {
        pairs[q] = __floats2bfloat162_rn(__bfloat162float(pairs[q].x) * s, __bfloat162float(pairs[q].y) * s);
      }
      row[v] = packed;
    }
  }
}

void check(const InputScaleArgs& a) {
  if (a.layout.expert_in_scale == 0 || a.counts.offset == nullptr || a.expert == nullptr || a.weight == nullptr ||
      a.slot_of_row == nullptr || a.expert_rows == nullptr || a.hidden % 8 != 0) {
    throw_internal("input scales: bad arguments");
  }
}

}  // namespace

void launch_write_input_scales(cudaStream_t stream, const DeviceTransport& t, const InputScaleArgs& a) {
  check(a);
  const int slots = a.tokens * a.top_k;
  if (slots == 0) return;
  write_scales_kernel<<<(slots + kScaleThreads - 1) / kScaleThreads, kScaleThreads, 0, stream>>>(t, a);
  TILEMOE_CUDA_CHECK_LAUNCH("input scales");
}

void launch_scale_expert_rows(cudaStream_t stream, const DeviceTransport& t, const InputScaleArgs& a) {
  check(a);
  if (a.row_bound == 0) return;
  const int ctas = static_cast<int>(std::min<std::int64_t>((a.row_bound + kScaleThreads / 32 - 1) / (kScaleThreads / 32), 1024));
  scale_rows_kernel<<<ctas, kScaleThreads, 0, stream>>>(t, a);
  TILEMOE_CUDA_CHECK_LAUNCH("scale expert rows");
}

}  // namespace tilemoe::cuda
