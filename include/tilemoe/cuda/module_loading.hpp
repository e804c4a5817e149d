#pragma once
// Kernels that wait for each other on one GPU (virtual ranks; a producer and its consumer)
// must not be loaded lazily: under CUDA's lazy module loading (the default since CUDA 12.2)
// the first launch of a kernel may synchronise the whole context, and so wait for a peer's
// kernel that is itself waiting for the kernel being loaded: a deadlock that only the wait
// timeout ends. tilemoe's own programs ask for eager loading at start-up; a library user
// who runs virtual ranks sets CUDA_MODULE_LOADING=EAGER (the layer refuses to run otherwise).
#include <cstdlib>

namespace tilemoe::cuda {

// Call first thing in main(), before any CUDA call; keeps an explicit user choice. Also asks
// for 32 hardware work queues (CUDA_DEVICE_MAX_CONNECTIONS, default 8): virtual ranks use
// three streams each, and two streams sharing a queue serialise, so an event wait of one rank
// could sit behind another rank's kernel that waits for the first.
inline void prepare_cuda_environment() {
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
}

// Whether the driver loads modules lazily in this process (false if it cannot tell).
bool lazy_module_loading();

}  // namespace tilemoe::cuda
