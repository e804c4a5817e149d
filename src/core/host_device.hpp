#pragma once
// Functions that the host and the device both run, so that the two sides cannot disagree (the
// plan compilers, the tile tables' decode): __host__ __device__ under nvcc, plain C++ elsewhere.
#if defined(__CUDACC__)
#define TILEMOE_HOST_DEVICE __host__ __device__
#else
#define TILEMOE_HOST_DEVICE
#endif
