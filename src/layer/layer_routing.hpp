#pragma once
// What a layer keeps on the device of its tokens' routing: the router's choices, the layout
// (per-expert offsets, the permutation both ways) and the error word, sized once for the most
// tokens a step may have. Shared by the one-GPU and the expert-parallel layer, as are the CUDA
// backend's limits on a layer.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "core/cuda/device_footprint.hpp"
#include "tilemoe/cuda/device_array.hpp"
#include "tilemoe/config.hpp"

namespace tilemoe::cuda {

// Bad input for what the CUDA backend does not do: fp32 storage, > 1024 experts.
void validate_cuda_layer(const MoeConfig& config);

struct LayerRouting {
  DeviceArray<std::int32_t> expert, sorted_expert;
  DeviceArray<float> weight;
  DeviceArray<int> row_offset, slot_of_row, row_of_slot, error_token;
  DeviceArray<char> layout_temp;
  std::size_t layout_temp_bytes = 0;
  DeviceArray<float> selection_bias;  // [experts] once set (set_selection_bias), else empty: none
  // the router's projection, once set (set_router_gate): gate [experts][hidden] bf16, the step's
  // logits [tokens][experts] fp32, the dtype they are rounded to, cuBLAS with a fixed workspace
  // (no allocation inside a captured step)
  DeviceArray<__nv_bfloat16> gate;
  DeviceArray<float> projected;
  DType logits_dtype = DType::F32;
  cublasHandle_t cublas = nullptr;
  DeviceArray<char> cublas_workspace;

  LayerRouting() = default;
  LayerRouting(const LayerRouting&) = delete;
  LayerRouting& operator=(const LayerRouting&) = delete;
  ~LayerRouting();

  // For config.tokens tokens of config.top_k slots and config.num_experts experts.
  void allocate(const MoeConfig& config);
  // What allocate() takes from the device.
  static DeviceFootprint device_bytes(const MoeConfig& config);

  // The router's selection bias for the steps that follow (empty: none), uploaded on `stream`
  // and waited for with `wait` (which must bound its wait); bad input unless one finite value
  // per expert.
  void set_selection_bias(const MoeConfig& config, std::span<const float> bias, cudaStream_t stream,
                          const std::function<void(const char*)>& wait);
  // The router's projection for the steps that follow: logits[t][e] = sum over hidden of
  // input[t][h] * gate[e][h] in fp32 (cuBLAS, fp32 accumulation, no TF32: the CPU's
  // router_logits() up to the order of the sums), rounded to `logits_dtype`. `gate` is
  // [experts][hidden] as Hugging Face stores gate.weight, held in bf16 (the layer's storage).
  void set_router_gate(const MoeConfig& config, std::span<const float> gate, DType logits_dtype, cudaStream_t stream,
                       const std::function<void(const char*)>& wait);
  // One step of `tokens` tokens: the router (the projection of `input` when `logits` is null,
  // config.router's rule, the NaN/Inf check into error_token), then the layout (counts,
  // offsets, permutation). Separate, for stage events.
  void launch_router(cudaStream_t stream, const __nv_bfloat16* input, const float* logits, int tokens, const MoeConfig& config);
  void launch_layout(cudaStream_t stream, int tokens, const MoeConfig& config);
};

}  // namespace tilemoe::cuda
