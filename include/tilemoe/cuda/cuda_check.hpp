#pragma once
// Turns a failed CUDA runtime call into a tilemoe::Error that names the call, the file and the
// line: of kind OutOfMemory when the device had no memory left (a caller may skip a problem
// too large for this GPU), Internal otherwise. Plain C++: usable from .cpp and .cu files alike.
#include <cuda_runtime.h>

#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file,
                                          int line) {
  throw Error(err == cudaErrorMemoryAllocation ? ErrorKind::OutOfMemory : ErrorKind::Internal,
              std::string("CUDA call ") + call + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                  ") at " + file + ":" + std::to_string(line));
}

inline void check_cuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err != cudaSuccess) throw_cuda_error(err, call, file, line);
}

}  // namespace tilemoe::cuda

#define TILEMOE_CUDA_CHECK(call) ::tilemoe::cuda::check_cuda((call), #call, __FILE__, __LINE__)

// Checks the launch of the kernel just enqueued (configuration errors, missing image, ...).
#define TILEMOE_CUDA_CHECK_LAUNCH(what) \
  ::tilemoe::cuda::check_cuda(cudaGetLastError(), what, __FILE__, __LINE__)
