#pragma once
// One virtual rank's benchmark data: random bf16 inputs made on the device, N(0,1) router
// logits (balanced routing), an output buffer, and the rank's world stream (RankStream::Main,
// not owned). Allocated
// after the rank's thread is bound to it and freed after the world's last step (cudaFree
// synchronises the whole device).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <random>
#include <vector>

#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/cuda/device_array.hpp"
#include "kernels/moe_kernels.hpp"

namespace tilemoe::bench {

struct RankData {
  cudaStream_t stream = nullptr;  // borrowed from the world
  std::size_t x_count = 0;
  cuda::DeviceArray<__nv_bfloat16> x, y;
  cuda::DeviceArray<float> logits;

  RankData(std::int64_t tokens, std::int64_t hidden, std::int64_t experts, std::uint64_t seed, int rank, cudaStream_t rank_stream)
      : stream(rank_stream), x_count(static_cast<std::size_t>(tokens * hidden)), x(x_count), y(x_count),
        logits(static_cast<std::size_t>(tokens * experts)) {
    cuda::launch_random_bf16(stream, x.data(), x_count, seed + 31 * static_cast<std::uint64_t>(rank), 1.0f);
    std::mt19937_64 rng(seed + static_cast<std::uint64_t>(rank));
    std::normal_distribution<float> normal;
    std::vector<float> l(logits.count());
    for (float& v : l) v = normal(rng);
    TILEMOE_CUDA_CHECK(cudaMemcpyAsync(logits.data(), l.data(), l.size() * 4, cudaMemcpyHostToDevice, stream));
    TILEMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  ~RankData() = default;
  RankData(const RankData&) = delete;
  RankData& operator=(const RankData&) = delete;

  void poison() { TILEMOE_CUDA_CHECK(cudaMemsetAsync(y.data(), 0xff, x_count * 2, stream)); }  // NaN
};

}  // namespace tilemoe::bench
