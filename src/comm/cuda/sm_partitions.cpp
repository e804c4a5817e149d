#include "comm/cuda/sm_partitions.hpp"

#include <cuda.h>

#include <string>

#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

template <typename Function>
Function driver_entry(const char* name) {
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &entry, 12040, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || entry == nullptr) {
    throw_bad_input(std::string("SM partitions need the CUDA driver's ") + name + " (green contexts, driver >= 12.4)");
  }
  return reinterpret_cast<Function>(entry);
}

void check_driver(CUresult result, const char* call) {
  if (result != CUDA_SUCCESS) {
    throw_internal(std::string("CUDA driver call ") + call + " failed with error " + std::to_string(static_cast<int>(result)));
  }
}

}  // namespace

SmPartitions::SmPartitions(int device, int count, int sms_each) {
  if (count < 1 || sms_each < 1) throw_bad_input("SM partitions: a positive count and size are needed");
  auto device_get = driver_entry<CUresult (*)(CUdevice*, int)>("cuDeviceGet");
  auto get_resource = driver_entry<CUresult (*)(CUdevice, CUdevResource*, CUdevResourceType)>("cuDeviceGetDevResource");
  auto split = driver_entry<CUresult (*)(CUdevResource*, unsigned*, const CUdevResource*, CUdevResource*, unsigned, unsigned)>(
      "cuDevSmResourceSplitByCount");
  auto describe = driver_entry<CUresult (*)(CUdevResourceDesc*, CUdevResource*, unsigned)>("cuDevResourceGenerateDesc");
  auto create = driver_entry<CUresult (*)(CUgreenCtx*, CUdevResourceDesc, CUdevice, unsigned)>("cuGreenCtxCreate");
  auto as_context = driver_entry<CUresult (*)(CUcontext*, CUgreenCtx)>("cuCtxFromGreenCtx");
  TILEMOE_CUDA_CHECK(cudaSetDevice(device));
  TILEMOE_CUDA_CHECK(cudaFree(nullptr));  // the primary context exists before the partitions are cut from it
  CUdevice dev;
  check_driver(device_get(&dev, device), "cuDeviceGet");
  CUdevResource whole;
  check_driver(get_resource(dev, &whole, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource");
  std::vector<CUdevResource> parts(static_cast<std::size_t>(count));
  unsigned groups = static_cast<unsigned>(count);
  CUdevResource rest;
  check_driver(split(parts.data(), &groups, &whole, &rest, 0, static_cast<unsigned>(sms_each)), "cuDevSmResourceSplitByCount");
  if (groups < static_cast<unsigned>(count)) {
    throw_bad_input("the GPU's " + std::to_string(whole.sm.smCount) + " SMs give only " + std::to_string(groups) +
                    " partitions of " + std::to_string(sms_each) + " SMs, not " + std::to_string(count));
  }
  for (CUdevResource& part : parts) {
    CUdevResourceDesc desc;
    check_driver(describe(&desc, &part, 1), "cuDevResourceGenerateDesc");
    CUgreenCtx green;
    check_driver(create(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate");
    green_.push_back(green);
    CUcontext context;
    check_driver(as_context(&context, green), "cuCtxFromGreenCtx");
    contexts_.push_back(context);
    sms_.push_back(static_cast<int>(part.sm.smCount));
  }
}

SmPartitions::~SmPartitions() {
  if (green_.empty()) return;
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuGreenCtxDestroy", &entry, 12040, cudaEnableDefault, &found) != cudaSuccess || !entry) return;
  auto destroy = reinterpret_cast<CUresult (*)(CUgreenCtx)>(entry);
  for (void* g : green_) destroy(static_cast<CUgreenCtx>(g));
}

void SmPartitions::enter(int i) const {
  static const auto set_current = driver_entry<CUresult (*)(CUcontext)>("cuCtxSetCurrent");
  check_driver(set_current(static_cast<CUcontext>(contexts_.at(static_cast<std::size_t>(i)))), "cuCtxSetCurrent");
}

}  // namespace tilemoe::cuda
