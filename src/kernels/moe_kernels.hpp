#pragma once
// The non-GEMM kernels of a MoE step on one GPU. All take their sizes from the host (fixed per
// launch: graph-capturable) and their routing-dependent counts from device memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "tilemoe/config.hpp"

namespace tilemoe::cuda {

// p[i] = uniform(-scale, scale) rounded to bf16, from a counter-based hash of (seed, first_index + i),
// i in [0, n): a slice of a larger drawn array gets the same values as the whole one.
void launch_random_bf16(cudaStream_t stream, __nv_bfloat16* p, std::size_t n, std::uint64_t seed, float scale,
                        std::uint64_t first_index = 0);

// p[0 .. n) = value.
void launch_fill(cudaStream_t stream, int* p, int n, int value);

// p[0 .. n) rounded to bf16 (to nearest even), kept as fp32.
void launch_round_to_bf16(cudaStream_t stream, float* p, int n);

// The router's rule (MoeConfig::router) as the kernel takes it; the selection bias, if any, on
// the device (one per expert).
struct RouterRule {
  RouterConfig config;
  bool renormalize = false;
  const float* selection_bias = nullptr;
};

// Routing on the device, one warp per token, E <= 1024, by the rule of include/tilemoe/routing.hpp
// in its order of operations (scores, biased choice, groups, top-k with ties to the lower id,
// weights, renormalisation, scaling). Mixtral's rule (softmax, top-k, optional renormalisation,
// no bias) runs a kernel of its own that keeps every value in registers. A NaN/Inf logit makes
// `error_token` the smallest such token index (atomicMin; initialise it to INT_MAX).
void launch_router(cudaStream_t stream, const float* logits, int tokens, int experts, int top_k, const RouterRule& rule,
                   std::int32_t* expert, float* weight, int* error_token);

// Layout of the routed rows: expert-major, tokens ascending inside an expert (a stable sort of
// the slots by expert id). Writes row_offset[E + 1], slot_of_row[T*k] (which slot each row
// holds) and row_of_slot[T*k] (its inverse). `temp` is scratch of layout_temp_bytes().
// With `capacity` >= 0 (routing.hpp's apply_capacity: the capacity of each expert in this
// step), the slots past their expert's capacity in the priority order (slot 0 of every token,
// tokens ascending, then slot 1, ...) are dropped: they follow the kept rows (rows from
// row_offset[E] on, which no expert reads) and their row_of_slot is -1.
std::size_t layout_temp_bytes(int slots, int experts, int top_k);
void launch_layout(cudaStream_t stream, const std::int32_t* expert, int slots, int top_k, int experts, int capacity, void* temp,
                   std::size_t temp_bytes, std::int32_t* sorted_expert, int* row_offset, int* slot_of_row,
                   int* row_of_slot);

// rows_out[i] = x[slot_of_row[i] / top_k], 16-byte vectors (hidden % 8 == 0).
void launch_permute(cudaStream_t stream, const __nv_bfloat16* x, int hidden, int top_k, const int* slot_of_row,
                    int rows, __nv_bfloat16* rows_out);

// act[i][c] = silu(h[i][2c]) * h[i][2c+1] (gate/up interleaved), or gelu(h[i][c]) when gelu.
void launch_activation(cudaStream_t stream, const __nv_bfloat16* h, int rows, int ffn, bool gelu, __nv_bfloat16* act);

// out[t] = sum over slots j in order of weight[t*k+j] * y[row_of_slot[t*k+j]] (dropped slots,
// row -1, skipped), fp32, rounded once.
void launch_combine(cudaStream_t stream, const __nv_bfloat16* y, const float* weight, const int* row_of_slot,
                    int tokens, int top_k, int hidden, __nv_bfloat16* out);

}  // namespace tilemoe::cuda
