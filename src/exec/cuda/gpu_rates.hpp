#pragma once
// The two rates of the SM split's cost model (src/strategies/tile_signal/split_model.hpp), measured on this
// GPU once and cached: the planned grouped GEMM's FLOP/s per SM and the consumer's row-copy
// bytes/s per CTA.
#include <cuda_runtime.h>

#include "tilemoe/gpu_rates.hpp"

namespace tilemoe::cuda {

// The device-to-device copy rate (read + write, GB/s) of a 4 GiB cudaMemcpy on `stream`: the
// memory ceiling the exchange benchmarks compare with.
double device_copy_gbps(cudaStream_t stream);

// Measures now on the calling thread's context (about 50 ms of GPU time; the GPU should be
// otherwise idle).
GpuRates calibrate_gpu_rates(int device);

// From the cache at default_rates_path() when it holds this GPU, else calibrated and cached
// (an unwritable cache is only a lost cache). Once per process.
const GpuRates& gpu_rates(int device);

}  // namespace tilemoe::cuda
