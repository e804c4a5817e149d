#pragma once
// Device helpers shared by the exchange kernels: the row copy and the segment search.
#include <cstddef>

namespace tilemoe::cuda {

// The last index i in [lo, hi) with offsets[i] <= value (offsets ascending).
__device__ inline int segment_of(const int* offsets, int lo, int hi, int value) {
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (offsets[mid] <= value) lo = mid; else hi = mid;
  }
  return lo;
}

// One warp copies a row of `bytes` (a multiple of 16) with 16-byte loads and stores.
__device__ inline void copy_row(std::byte* dst, const std::byte* src, int bytes, int lane) {
  const auto* s = reinterpret_cast<const uint4*>(src);
  auto* d = reinterpret_cast<uint4*>(dst);
  for (int v = lane; v < bytes / 16; v += 32) d[v] = s[v];
}

}  // namespace tilemoe::cuda
