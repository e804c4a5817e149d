#include "tilemoe/cuda/module_loading.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

namespace tilemoe::cuda {

bool lazy_module_loading() {
  // through the runtime's entry-point query, so that tilemoe needs no link to the driver library
  using GetLoadingMode = CUresult (*)(CUmoduleLoadingMode*);
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuModuleGetLoadingMode", &entry, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || entry == nullptr) {
    return false;
  }
  CUmoduleLoadingMode mode = CU_MODULE_EAGER_LOADING;
  if (reinterpret_cast<GetLoadingMode>(entry)(&mode) != CUDA_SUCCESS) return false;
  return mode == CU_MODULE_LAZY_LOADING;
}

}  // namespace tilemoe::cuda
