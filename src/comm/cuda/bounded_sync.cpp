#include "comm/cuda/bounded_sync.hpp"

#include <thread>

#include "tilemoe/cuda/cuda_check.hpp"

namespace tilemoe::cuda {

bool wait_for_stream(cudaStream_t stream, std::chrono::milliseconds timeout, const std::function<void()>& keep_going) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(5);
  for (;;) {
    const cudaError_t state = cudaStreamQuery(stream);
    if (state == cudaSuccess) return true;
    if (state != cudaErrorNotReady) TILEMOE_CUDA_CHECK(state);
    if (keep_going) keep_going();
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));  // quick for short waits, cheap for long ones
  }
}

}  // namespace tilemoe::cuda
