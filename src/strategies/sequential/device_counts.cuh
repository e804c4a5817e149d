#pragma once
// What every device plan compiler shares. Its prefix kernel, one CTA: every rank's row offsets,
// each rank's ExpertIn rows per local expert, and the sequential prefix sums over the local
// experts, a warp-wide scan each (the host sums them on one thread: step_counts.hpp,
// sequential_prefix), into the plan's scratch; tile_signal adds a prefix of its own. Its tables
// kernel then reads them back, an entry per thread over a grid.
#include <algorithm>

#include "plan/device_plan_tables.hpp"
#include "sequential_plan.hpp"
#include "tilemoe/cuda/cuda_check.hpp"

namespace tilemoe::cuda::device_compile {

constexpr unsigned kFullWarp = 0xffffffffu;
constexpr int kPrefixThreads = 1024;  // the one CTA of the prefix sums
constexpr int kEntryThreads = 256;    // a CTA of the tables kernel: an entry per thread



__device__ __forceinline__ int warp_inclusive_sum(int v, int lane) {
  for (int offset = 1; offset < 32; offset *= 2) {
    const int below = __shfl_up_sync(kFullWarp, v, offset);
    if (lane >= offset) v += below;
  }
  return v;
}

// out[i] = in[0] + ... + in[i - 1] for i <= n (out[n]: the total), by one whole warp, 32 entries
// at a time. `in` may be `out`: each entry is read, then written, by the same lane.
__device__ inline void warp_exclusive_scan(const int* in, int* out, int n, int lane) {
  int running = 0;
  for (int base = 0; base < n; base += 32) {
    const int i = base + lane;
    const int v = i < n ? in[i] : 0;
    const int inclusive = warp_inclusive_sum(v, lane);
    if (i < n) out[i] = running + inclusive - v;
    running += __shfl_sync(kFullWarp, inclusive, 31);
  }
  if (lane == 0) out[n] = running;
}

// Exclusive prefix of value(e) over e < n into out[0..n] by one whole warp.
template <typename Value>
__device__ inline void warp_exclusive_prefix(int n, int* out, int lane, Value value) {
  int running = 0;
  for (int base = 0; base < n; base += 32) {
    const int e = base + lane;
    const int v = e < n ? value(e) : 0;
    const int inclusive = warp_inclusive_sum(v, lane);
    if (e < n) out[e] = running + inclusive - v;
    running += __shfl_sync(kFullWarp, inclusive, 31);
  }
  if (lane == 0) out[n] = running;
}

// Every thread of the CTA calls it; returns the counts' view, complete (after a barrier), with
// the sequential prefix sums in prefix[0, sequential_prefix_size(L)).
// `rank_tokens` (StepCounts::rank_tokens) is only passed through: null with a row per expert.
__device__ inline plan_detail::StepCounts counts_and_prefix(const int* counts, const int* offsets, const int* rank_tokens, int world,
                                                            int experts, int* offset, int* rank_row, int* prefix,
                                                            const plan_detail::SequentialShape& shape) {
  const int thread = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  const int lane = thread % 32, warp = thread / 32, warps = threads / 32;
  const int L = experts / world;
  // every rank's offsets: offset[q][x] = rank q's rows of the experts before x
  if (counts != nullptr) {
    for (int q = warp; q < world; q += warps) warp_exclusive_scan(counts + q * experts, offset + q * (experts + 1), experts, lane);
  } else {
    for (int i = thread; i < world * (experts + 1); i += threads) offset[i] = offsets[i];
  }
  __syncthreads();
  // rank d's ExpertIn: local expert e's rows (from every source), then their prefix sums
  for (int i = thread; i < world * L; i += threads) {
    const int d = i / L, e = i % L, x = d * L + e;
    int rows = 0;
    for (int q = 0; q < world; ++q) rows += offset[q * (experts + 1) + x + 1] - offset[q * (experts + 1) + x];
    rank_row[d * (L + 1) + e] = rows;
  }
  __syncthreads();
  for (int d = warp; d < world; d += warps) warp_exclusive_scan(rank_row + d * (L + 1), rank_row + d * (L + 1), L, lane);
  __syncthreads();
  const plan_detail::StepCounts view{world, experts, L, offset, rank_row, rank_tokens};
  // each GEMM's tiles per local expert, their prefix sums and the tiles that compute rows
  if (warp < 2) {
    const int layer = warp, col_tiles = plan_detail::sequential_column_tiles(shape, layer);
    int* first = prefix + layer * (L + 2);
    warp_exclusive_prefix(L, first, lane, [&](int e) { return plan_detail::sequential_expert_tiles(view, shape, layer, e).entries; });
    int real = 0;
    for (int base = 0; base < L; base += 32) {
      const int e = base + lane;
      const int v = e < L ? plan_detail::sequential_expert_tiles(view, shape, layer, e).m_tiles * col_tiles : 0;
      real += __shfl_sync(kFullWarp, warp_inclusive_sum(v, lane), 31);
    }
    if (lane == 0) first[L + 1] = real;
  }
  __syncthreads();
  return view;
}

// Every table of a plan, a thread per entry over a grid: `Compile` (a strategy's, with its shape
// inside) is called as compile(counts, prefix, tables, lane, lanes) on the counts and prefix
// sums the prefix kernel left in the plan's scratch. The first thread writes the header and
// counts back; `tables` (the pointers and room) comes by value, so no CTA reads what it writes.
template <typename Compile>
__global__ void __launch_bounds__(kEntryThreads) plan_tables_kernel(int world, int experts, const int* offset, const int* rank_row,
                                                                   const int* rank_tokens, const int* prefix, Compile compile,
                                                                   PlanTables tables, PlanTables* plan) {
  const plan_detail::StepCounts view{world, experts, experts / world, offset, rank_row, rank_tokens};
  const int lane = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x), lanes = static_cast<int>(gridDim.x * blockDim.x);
  compile(view, prefix, tables, lane, lanes);
  if (lane == 0) *plan = tables;
}

// Launches it with a thread per entry of the largest table's room (each thread takes every
// lanes-th entry past that; at most 1024 CTAs).
template <typename Compile>
void launch_plan_tables(cudaStream_t stream, const DevicePlanTables& plan, const int* rank_tokens, const Compile& compile,
                        const char* what) {
  const int ctas = std::min((plan.most_entries() + kEntryThreads - 1) / kEntryThreads, 1024);
  plan_tables_kernel<<<ctas, kEntryThreads, 0, stream>>>(plan.world(), plan.experts(), plan.offset(), plan.rank_row(), rank_tokens,
                                                         plan.prefix(), compile, plan.empty_tables(), plan.view());
  TILEMOE_CUDA_CHECK_LAUNCH(what);
}

}  // namespace tilemoe::cuda::device_compile
