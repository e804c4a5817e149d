#pragma once
// A whole MoE forward step on one GPU (expert parallel size 1): router, layout, permute,
// GEMM0 + activation, GEMM1, combine. Everything is enqueued on the caller's stream with no
// host synchronisation, so a forward of a fixed token count can be captured in a CUDA graph.
// Storage bf16, accumulation fp32; the routing-dependent counts never leave the device.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "tilemoe/config.hpp"
#include "tilemoe/routing.hpp"
#include "tilemoe/weights.hpp"

namespace tilemoe::cuda {

// Events recorded between the stages of a forward, for per-stage timing.
enum Stage { kRouter, kLayout, kPermute, kGemm0, kActivation, kGemm1, kCombine, kStageCount };
const char* stage_name(int stage);
struct StageEvents {
  cudaEvent_t boundary[kStageCount + 1];  // boundary[s] before stage s, boundary[kStageCount] at the end
};

// Weights drawn on the device (uniform, scaled to keep activations O(1)), for benchmarks of
// layers whose weights would take minutes to make and upload from the host.
struct RandomDeviceWeights {
  std::uint64_t seed = 1;
};

// Which grouped GEMMs a layer runs.
//  Planned: the tile-table GEMM (src/exec/cuda/planned_gemm.hpp) with the activation fused into
//           GEMM0's epilogue (the activation stage is empty); the tile tables are built on the
//           device during the layout stage. The default.
//  Stock:   CUTLASS's own grouped kernels and a separate activation kernel that reads gate and
//           up rounded to bf16 (another rounding point); kept as a baseline.
enum class GemmPath { Planned, Stock };
struct MoeLayerOptions {
  GemmPath gemm = GemmPath::Planned;
  // How long check() and last_routing() wait for the stream before a timeout error. A forward
  // takes milliseconds; the limit is for a kernel that never finishes (a stall becomes an error
  // rather than a hang). Raise it for runs under compute-sanitizer, which are 100-1000x slower.
  // (0, 24 h]. After a timeout the stalled work still runs: the layer cannot be used or destroyed
  // safely until it ends (freeing its memory waits for it).
  std::chrono::milliseconds wait_limit{60'000};
};

class MoeLayer {
 public:
  // `config.tokens` is the largest token count forward() will be given; workspaces are sized
  // for it once. Weights are uploaded (bf16) to `device`. Bad input (fp32 storage, more than
  // 1024 experts; expert biases or GPT-OSS's clamped SwiGLU on the stock GEMM) is a bad-input
  // error: the CUDA backend does not do them yet.
  MoeLayer(const MoeConfig& config, const ExpertWeights& weights, int device = 0, MoeLayerOptions options = {});
  MoeLayer(const MoeConfig& config, RandomDeviceWeights weights, int device = 0, MoeLayerOptions options = {});
  ~MoeLayer();
  // The device memory a layer of `config` allocates, counted in the driver's 2 MiB pages (an
  // upper bound), so that a caller can refuse what will not fit before building anything;
  // `shared_expert_ffn`: the width of the layer's shared expert (0: none).
  static std::size_t device_bytes(const MoeConfig& config, MoeLayerOptions options = {}, std::int64_t shared_expert_ffn = 0);
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  // input [tokens, hidden] bf16, router_logits [tokens, experts] fp32 (or null: the gate computes
  // them, set_router_gate), output [tokens, hidden]
  // bf16: device pointers, 16-byte aligned. tokens <= config.tokens.
  void forward(cudaStream_t stream, const __nv_bfloat16* input, const float* router_logits, __nv_bfloat16* output,
               std::int64_t tokens, const StageEvents* events = nullptr);

  // Device pointers of the last forward's intermediate tables, for baselines that reuse them.
  const int* row_offset() const;            // [E + 1]
  const __nv_bfloat16* permuted_rows() const;  // [T*k, hidden]
  const __nv_bfloat16* expert_weights0() const;  // [E][2*ffn (gate/up interleaved) or ffn][hidden]
  const __nv_bfloat16* expert_weights2() const;  // [E][hidden][ffn]

  // Waits for the stream (at most options.wait_limit: then a timeout error) and throws what the
  // last forward found on the device: a NaN or infinite router logit is a bad-input error
  // naming the token.
  void check(cudaStream_t stream);

  // The router's selection bias (DeepSeek-V3's e_score_correction_bias: one per expert, added to
  // the scores to choose the experts, not to weigh them) for the forwards that follow; empty:
  // none. Call it between steps (after check()): it copies on the layer's own stream and waits,
  // bounded.
  void set_selection_bias(std::span<const float> bias);
  // The router inside the layer: its gate [experts][hidden] (Hugging Face's gate.weight), for
  // the forwards given no router logits (router_logits = nullptr): logits = input x gate^T with
  // fp32 sums (bf16 inputs), rounded to `logits_dtype` (Mixtral and Qwen compute them in the
  // model's bf16, DeepSeek-V3 in fp32). Call it between steps; it copies and waits, bounded.
  void set_router_gate(std::span<const float> gate, DType logits_dtype = DType::BF16);

  // The routing the last forward used (waits for the stream, as check() does), to check the expert path
  // against the CPU oracle on exactly the same choices.
  Routing last_routing(cudaStream_t stream, std::int64_t tokens) const;

  const MoeConfig& config() const;
  // The GEMM configuration in use, e.g. "planned c1x2" or "stock coop128x256_c1x2".
  std::string gemm_description() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tilemoe::cuda
