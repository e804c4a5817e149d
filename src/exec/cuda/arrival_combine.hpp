#pragma once
// The owner's arrival combine: launched right after its GEMM1, it combines each of its tokens
// as soon as the token's k rows have landed (their arrival flags at the step's epoch), in top-k
// slot order, on a persistent grid that never waits for the whole exchange: bitwise the
// sequential combine's output.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "comm/cuda/device_transport.hpp"

namespace tilemoe::cuda {

struct ArrivalCombineArgs {
  const std::uint64_t* epoch = nullptr;  // this step's (device)
  std::size_t returned_rows = 0;         // region offsets (EpRegionLayout)
  std::size_t row_arrivals = 0;
  const std::int32_t* expert = nullptr;  // [tokens * top_k] the router's choices (a row's source rank)
  const float* weight = nullptr;         // [tokens * top_k]
  const int* row_of_slot = nullptr;      // [tokens * top_k] where each slot's row returns (-1: dropped, none)
  int tokens = 0, top_k = 0, hidden = 0, local_experts = 1;
  int ctas = 1;                          // the persistent grid: all of them may wait at once
  __nv_bfloat16* output = nullptr;       // [tokens][hidden]
};

// The owner's combine, token by token as rows land; bitwise the sequential combine's output.
void launch_arrival_combine(cudaStream_t stream, const DeviceTransport& transport, const ArrivalCombineArgs& args);
// Its resident CTAs per SM, for sizing a grid that fits beside the other ranks' waiting kernels.
int arrival_combine_ctas_per_sm();

}  // namespace tilemoe::cuda
