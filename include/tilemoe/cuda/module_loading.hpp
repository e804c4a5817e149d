#pragma once
// Kernels that wait for each other on one GPU (virtual ranks; a producer and its consumer)
// must not be loaded lazily: under CUDA's lazy module loading (the default since CUDA 12.2)
// the first launch of a kernel may synchronise the whole context, and so wait for a peer's
// kernel that is itself waiting for the kernel being loaded: a deadlock that only the wait
// timeout ends. tilemoe's own programs ask for eager loading at start-up; a library user
// who runs virtual ranks sets CUDA_MODULE_LOADING=EAGER (the layer refuses to run otherwise).
#include <cstdlib>

namespace tilemoe::cuda {

// Call first thing in main(), before any CUDA call; keeps an explicit user choice.
inline void request_eager_module_loading() { setenv("CUDA_MODULE_LOADING", "EAGER", 0); }

// Whether the driver loads modules lazily in this process (false if it cannot tell).
bool lazy_module_loading();

}  // namespace tilemoe::cuda
