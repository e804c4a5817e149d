#pragma once
// What a layer's device allocations take from the GPU, counted before they are made, so that a
// step that cannot fit is refused with the bytes it needs instead of failing in cudaMalloc half
// way through building a world. Each allocation is counted rounded up to the driver's 2 MiB
// page: an upper bound of what cudaMemGetInfo sees go (small arrays may share a page).
#include <cstddef>
#include <cstdint>
#include <limits>

namespace tilemoe::cuda {

class DeviceFootprint {
 public:
  static constexpr std::size_t kPage = std::size_t{2} << 20;

  // one allocation of `count` elements of `element_bytes` (at least one element, as DeviceArray does)
  void add(std::size_t count, std::size_t element_bytes) {
    const std::size_t elements = count > 0 ? count : 1;
    if (element_bytes != 0 && elements > std::numeric_limits<std::size_t>::max() / 4 / element_bytes) {
      bytes_ = std::numeric_limits<std::size_t>::max();  // absurd: reads as too large, never as small
      return;
    }
    add_bytes((elements * element_bytes + kPage - 1) / kPage * kPage);
  }
  // another footprint's allocations, already rounded
  void add(const DeviceFootprint& other) { add_bytes(other.bytes_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void add_bytes(std::size_t bytes) {
    bytes_ = bytes > std::numeric_limits<std::size_t>::max() - bytes_ ? std::numeric_limits<std::size_t>::max() : bytes_ + bytes;
  }
  std::size_t bytes_ = 0;
};

}  // namespace tilemoe::cuda
