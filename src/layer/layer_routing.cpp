#include "layer_routing.hpp"

#include <algorithm>
#include <climits>
#include <limits>
#include <vector>

#include "kernels/moe_kernels.hpp"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/dtype.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/routing.hpp"

namespace tilemoe::cuda {

void validate_cuda_layer(const MoeConfig& c) {
  validate(c);
  if (c.dtype != DType::BF16) throw_bad_input("the CUDA backend stores bf16 only: use --dtype bf16");
  if (c.num_experts > 1024) throw_bad_input("the CUDA router handles at most 1024 experts");
}

void LayerRouting::allocate(const MoeConfig& c) {
  const auto slot_room = std::max<std::size_t>(static_cast<std::size_t>(c.tokens * c.top_k), 1);
  expert = DeviceArray<std::int32_t>(slot_room);
  sorted_expert = DeviceArray<std::int32_t>(slot_room);
  weight = DeviceArray<float>(slot_room);
  row_offset = DeviceArray<int>(static_cast<std::size_t>(c.num_experts + 1));
  slot_of_row = DeviceArray<int>(slot_room);
  row_of_slot = DeviceArray<int>(slot_room);
  error_token = DeviceArray<int>(1);
  layout_temp_bytes = tilemoe::cuda::layout_temp_bytes(static_cast<int>(slot_room), static_cast<int>(c.num_experts), static_cast<int>(c.top_k));
  layout_temp = DeviceArray<char>(layout_temp_bytes);
}

DeviceFootprint LayerRouting::device_bytes(const MoeConfig& c) {
  const auto slot_room = std::max<std::size_t>(static_cast<std::size_t>(std::max<std::int64_t>(c.tokens * c.top_k, 0)), 1);
  DeviceFootprint f;
  if (slot_room > INT_MAX / 2) {  // beyond what the layout's int indices hold: refused later, too large here
    f.add(std::numeric_limits<std::size_t>::max(), 1);
    return f;
  }
  f.add(slot_room, sizeof(std::int32_t));  // expert
  f.add(slot_room, sizeof(std::int32_t));  // sorted_expert
  f.add(slot_room, sizeof(float));         // weight
  f.add(static_cast<std::size_t>(c.num_experts + 1), sizeof(int));  // row_offset
  f.add(slot_room, sizeof(int));  // slot_of_row
  f.add(slot_room, sizeof(int));  // row_of_slot
  f.add(1, sizeof(int));          // error_token
  f.add(tilemoe::cuda::layout_temp_bytes(static_cast<int>(slot_room), static_cast<int>(c.num_experts), static_cast<int>(c.top_k)), 1);
  return f;
}

void LayerRouting::set_selection_bias(const MoeConfig& c, std::span<const float> bias, cudaStream_t stream,
                                      const std::function<void(const char*)>& wait) {
  check_selection_bias(bias, c.num_experts);
  if (bias.empty()) {
    selection_bias = DeviceArray<float>();
    return;
  }
  if (selection_bias.count() != bias.size()) selection_bias = DeviceArray<float>(bias.size());
  TILEMOE_CUDA_CHECK(cudaMemcpyAsync(selection_bias.data(), bias.data(), bias.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
  wait("the router's selection bias upload");
}

LayerRouting::~LayerRouting() {
  if (cublas != nullptr) cublasDestroy(cublas);
}

void LayerRouting::set_router_gate(const MoeConfig& c, std::span<const float> weights, DType dtype, cudaStream_t stream,
                                   const std::function<void(const char*)>& wait) {
  check_router_gate(weights, c.num_experts, c.hidden);
  std::vector<std::byte> bits(weights.size() * 2);
  store_row(DType::BF16, weights.data(), weights.size(), bits.data());
  if (cublas == nullptr) {
    constexpr std::size_t kWorkspaceBytes = 4u << 20;  // cuBLAS's own default size on Hopper
    if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) throw_internal("cuBLAS could not start (cublasCreate)");
    cublas_workspace = DeviceArray<char>(kWorkspaceBytes);
    if (cublasSetWorkspace(cublas, cublas_workspace.data(), kWorkspaceBytes) != CUBLAS_STATUS_SUCCESS ||
        cublasSetMathMode(cublas, CUBLAS_PEDANTIC_MATH) != CUBLAS_STATUS_SUCCESS) {
      throw_internal("cuBLAS refused its workspace or math mode");
    }
  }
  gate = DeviceArray<__nv_bfloat16>(weights.size());
  projected = DeviceArray<float>(static_cast<std::size_t>(std::max<std::int64_t>(c.tokens * c.num_experts, 1)));
  logits_dtype = dtype;
  TILEMOE_CUDA_CHECK(cudaMemcpyAsync(gate.data(), bits.data(), bits.size(), cudaMemcpyHostToDevice, stream));
  wait("the router's gate upload");
}

void LayerRouting::launch_router(cudaStream_t stream, const __nv_bfloat16* input, const float* logits, int tokens,
                                 const MoeConfig& c) {
  launch_fill(stream, error_token.data(), 1, INT_MAX);
  if (logits == nullptr) {
    if (tokens > 0) {  // (forward refused a step without logits and without a gate)
      const float one = 1.0f, zero = 0.0f;
      const int E = static_cast<int>(c.num_experts), H = static_cast<int>(c.hidden);
      // column-major: projected^T [E x T] = gate [H x E]^T x input [H x T]
      if (cublasSetStream(cublas, stream) != CUBLAS_STATUS_SUCCESS ||
          cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, E, tokens, H, &one, gate.data(), CUDA_R_16BF, H, input, CUDA_R_16BF, H,
                       &zero, projected.data(), CUDA_R_32F, E, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
        throw_internal("cuBLAS refused the router's projection");
      }
      if (logits_dtype == DType::BF16) launch_round_to_bf16(stream, projected.data(), tokens * E);
    }
    logits = projected.data();
  }
  RouterRule rule;
  rule.config = c.router;
  rule.renormalize = c.renormalize;
  rule.selection_bias = selection_bias.count() > 0 ? selection_bias.data() : nullptr;
  tilemoe::cuda::launch_router(stream, logits, tokens, static_cast<int>(c.num_experts), static_cast<int>(c.top_k), rule,
                               expert.data(), weight.data(), error_token.data());
}

void LayerRouting::launch_layout(cudaStream_t stream, int tokens, const MoeConfig& c) {
  // the capacity rule of the CPU engine's route(), on this step's tokens
  int capacity = -1;
  if (c.capacity_factor > 0.0) {
    MoeConfig step = c;
    step.tokens = tokens;
    capacity = static_cast<int>(expert_capacity(step));
  }
  tilemoe::cuda::launch_layout(stream, expert.data(), tokens * static_cast<int>(c.top_k), static_cast<int>(c.top_k),
                               static_cast<int>(c.num_experts), capacity, layout_temp.data(), layout_temp_bytes, sorted_expert.data(),
                               row_offset.data(), slot_of_row.data(), row_of_slot.data());
}

}  // namespace tilemoe::cuda
