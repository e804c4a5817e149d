#include "shared_expert_ffn.hpp"

#include <algorithm>
#include <vector>

#include "core/cuda/current_device.hpp"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

constexpr int kSumThreads = 256;

__global__ void one_group_kernel(int* row_offset, int tokens) {
  row_offset[0] = 0;
  row_offset[1] = tokens;
}

// A CTA per token: the gate's dot product over the hidden columns in fp32 (a CTA reduction:
// the CPU sums in column order, so the two agree to rounding, not bitwise), stored, its sigmoid
// stored, the scaled output stored, then the sum with the routed output stored.
__global__ void __launch_bounds__(kSumThreads) add_shared_kernel(const __nv_bfloat16* input, const __nv_bfloat16* y,
                                                                 const __nv_bfloat16* gate, int hidden, __nv_bfloat16* output) {
  __shared__ float s_partial[kSumThreads / 32];
  __shared__ float s_scale;
  const int t = static_cast<int>(blockIdx.x), tid = static_cast<int>(threadIdx.x);
  const std::size_t row = static_cast<std::size_t>(t) * hidden;
  if (gate != nullptr) {
    float sum = 0.0f;
    for (int c = tid; c < hidden; c += kSumThreads) sum += __bfloat162float(input[row + c]) * __bfloat162float(gate[c]);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (tid % 32 == 0) s_partial[tid / 32] = sum;
    __syncthreads();
    if (tid == 0) {
      float g = 0.0f;
      for (int w = 0; w < kSumThreads / 32; ++w) g += s_partial[w];
      const float stored = __bfloat162float(__float2bfloat16_rn(g));
      s_scale = __bfloat162float(__float2bfloat16_rn(1.0f / (1.0f + expf(-stored))));
    }
    __syncthreads();
  }
  for (int c = tid; c < hidden; c += kSumThreads) {
    float v = __bfloat162float(y[row + c]);
    if (gate != nullptr) v = __bfloat162float(__float2bfloat16_rn(s_scale * v));
    output[row + c] = __float2bfloat16_rn(__bfloat162float(output[row + c]) + v);
  }
}

MoeConfig one_expert(const MoeConfig& layer, std::int64_t ffn_hidden, std::int64_t max_tokens) {
  MoeConfig c = layer;
  c.num_experts = 1;
  c.top_k = 1;
  c.ffn_hidden = ffn_hidden;
  c.tokens = max_tokens;
  return c;
}

}  // namespace

SharedExpertFfn::SharedExpertFfn(const MoeConfig& layer, const SharedExpert& shared, std::int64_t max_tokens, int device)
    : expert_(one_expert(layer, shared.ffn.ffn_hidden, max_tokens)), max_tokens_(max_tokens) {
  if (shared.ffn.hidden != layer.hidden || shared.ffn.activation != layer.activation) {
    throw_bad_input("the shared expert is " + std::to_string(shared.ffn.hidden) + " wide with another activation than the layer's " +
                    std::to_string(layer.hidden));
  }
  if (shared.ffn.has_biases()) throw_bad_input("the CUDA backend runs a shared expert without biases only: use --backend cpu");
  use_device(device);
  const std::int64_t rows = std::max<std::int64_t>(max_tokens, 1);
  ffn_ = std::make_unique<ExpertFfn>(expert_, 0, 1, rows, static_cast<double>(rows), GemmPath::Stock, device);
  ffn_->upload(shared.ffn);
  row_offset_ = DeviceArray<int>(2);
  y_ = DeviceArray<__nv_bfloat16>(static_cast<std::size_t>(rows * layer.hidden));
  if (!shared.gate.empty()) {
    std::vector<__nv_bfloat16> gate(shared.gate.size());
    std::transform(shared.gate.begin(), shared.gate.end(), gate.begin(), [](float v) { return __float2bfloat16_rn(v); });
    gate_ = DeviceArray<__nv_bfloat16>(gate.data(), gate.size());
  }
}

DeviceFootprint SharedExpertFfn::device_bytes(const MoeConfig& layer, std::int64_t ffn_hidden, std::int64_t max_tokens) {
  const std::int64_t rows = std::max<std::int64_t>(max_tokens, 1);
  DeviceFootprint f = ExpertFfn::device_bytes(one_expert(layer, ffn_hidden, max_tokens), 1, rows, GemmPath::Stock);
  f.add(2, sizeof(int));
  f.add(static_cast<std::size_t>(rows * layer.hidden), sizeof(__nv_bfloat16));  // y
  f.add(static_cast<std::size_t>(layer.hidden), sizeof(__nv_bfloat16));         // gate
  return f;
}

void SharedExpertFfn::add(cudaStream_t stream, const __nv_bfloat16* input, __nv_bfloat16* output, int tokens) {
  if (tokens < 0 || tokens > max_tokens_) throw_internal("shared expert: " + std::to_string(tokens) + " tokens");
  if (tokens == 0) return;
  one_group_kernel<<<1, 1, 0, stream>>>(row_offset_.data(), tokens);
  TILEMOE_CUDA_CHECK_LAUNCH("shared expert rows");
  ffn_->run_gemm0(stream, row_offset_.data(), input, tokens);
  ffn_->run_activation(stream, tokens);
  ffn_->run_gemm1(stream, row_offset_.data(), tokens, y_.data());
  add_shared_kernel<<<tokens, kSumThreads, 0, stream>>>(input, y_.data(), gate_.count() > 0 ? gate_.data() : nullptr,
                                                        static_cast<int>(expert_.hidden), output);
  TILEMOE_CUDA_CHECK_LAUNCH("shared expert sum");
}

}  // namespace tilemoe::cuda
