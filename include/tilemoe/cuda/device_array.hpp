#pragma once
// A typed device allocation that frees itself: move-only, checked, optionally filled from host.
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "tilemoe/cuda/cuda_check.hpp"

namespace tilemoe::cuda {

template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t count) : count_(count) {
    if (count > 0) TILEMOE_CUDA_CHECK(cudaMalloc(&data_, count * sizeof(T)));
  }
  // `count` elements copied from host memory.
  DeviceArray(const void* host, std::size_t count) : DeviceArray(count) {
    if (count > 0) TILEMOE_CUDA_CHECK(cudaMemcpy(data_, host, count * sizeof(T), cudaMemcpyHostToDevice));
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(count_, other.count_);
    return *this;
  }
  ~DeviceArray() {
    if (data_) cudaFree(data_);
  }

  T* data() const { return data_; }
  std::size_t count() const { return count_; }

 private:
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace tilemoe::cuda
