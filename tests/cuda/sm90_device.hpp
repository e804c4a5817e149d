#pragma once
// The GPU test programs' start: device 0 must be an sm_90 GPU (H100/H200), else they skip with
// exit code 77. Fills `prop` and prints the device when it is one.
#include <cuda_runtime.h>

#include <cstdio>

inline bool sm90_device_or_skip(cudaDeviceProp& prop, const char* what) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device\n");
    return false;
  }
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::printf("SKIP: cannot query device 0\n");
    return false;
  }
  if (prop.major != 9 || prop.minor != 0) {
    std::printf("SKIP: device 0 (%s) is sm_%d%d, %s needs sm_90\n", prop.name, prop.major, prop.minor, what);
    return false;
  }
  std::printf("device 0: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  return true;
}
