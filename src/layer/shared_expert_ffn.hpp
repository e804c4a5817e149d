#pragma once
// A layer's shared expert on the GPU (include/tilemoe/shared_expert.hpp says what it is and
// where it rounds): every token of the rank, after the routed experts' combine, through one
// expert's FFN (the stock grouped GEMM with a single group: its GEMM0 output, the activation and
// GEMM1's output are each stored in bf16, as the models' bf16 modules store them), then the
// optional sigmoid gate and the sum into the layer's output. Shared by the one-GPU and the
// expert-parallel layer; every strategy's routed output is the same bits, so its sum is too.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "core/cuda/device_footprint.hpp"
#include "expert_ffn.hpp"
#include "tilemoe/config.hpp"
#include "tilemoe/cuda/device_array.hpp"
#include "tilemoe/shared_expert.hpp"

namespace tilemoe::cuda {

class SharedExpertFfn {
 public:
  // For steps of at most `max_tokens` tokens of `layer` (its hidden, activation and dtype).
  SharedExpertFfn(const MoeConfig& layer, const SharedExpert& shared, std::int64_t max_tokens, int device);
  // What the constructor allocates for a shared expert `ffn_hidden` wide.
  static DeviceFootprint device_bytes(const MoeConfig& layer, std::int64_t ffn_hidden, std::int64_t max_tokens);

  // output[t] = round(output[t] + shared(input[t])) for t < tokens, on `stream`.
  void add(cudaStream_t stream, const __nv_bfloat16* input, __nv_bfloat16* output, int tokens);

 private:
  MoeConfig expert_;  // the shared expert as a layer of one expert
  std::int64_t max_tokens_ = 0;
  std::unique_ptr<ExpertFfn> ffn_;
  DeviceArray<int> row_offset_;       // [2]: 0, tokens (its one group's rows)
  DeviceArray<__nv_bfloat16> y_;      // [max_tokens][hidden] the FFN's output
  DeviceArray<__nv_bfloat16> gate_;   // [hidden], empty: ungated
};

}  // namespace tilemoe::cuda
