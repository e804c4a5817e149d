#pragma once
// The median time of `runs` enqueues of `launch` on `stream`, after `warmup` more, each between
// two CUDA events (the stream synchronised after each).
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "tilemoe/cuda/cuda_check.hpp"

namespace tilemoe::cuda {

template <typename Launch>
float median_event_ms(cudaStream_t stream, int runs, int warmup, Launch launch) {
  cudaEvent_t a, b;
  TILEMOE_CUDA_CHECK(cudaEventCreate(&a));
  TILEMOE_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < runs + warmup; ++i) {
    TILEMOE_CUDA_CHECK(cudaEventRecord(a, stream));
    launch();
    TILEMOE_CUDA_CHECK(cudaEventRecord(b, stream));
    TILEMOE_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    TILEMOE_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    if (i >= warmup) ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace tilemoe::cuda
