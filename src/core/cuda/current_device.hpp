#pragma once
// Makes `device` current on the calling thread only when it is not already. cudaSetDevice
// always binds the device's primary context, which would throw a thread out of the SM
// partition (green context) a virtual rank runs in; when the device is already current the
// thread's context, partition or not, is kept.
#include <cuda_runtime.h>

#include "tilemoe/cuda/cuda_check.hpp"

namespace tilemoe::cuda {

inline void use_device(int device) {
  int current = -1;
  TILEMOE_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) TILEMOE_CUDA_CHECK(cudaSetDevice(device));
}

}  // namespace tilemoe::cuda
