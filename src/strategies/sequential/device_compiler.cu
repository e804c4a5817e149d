#include "device_compiler.hpp"

#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

constexpr int kCompilerThreads = 1024;
constexpr unsigned kFullWarp = 0xffffffffu;

__device__ __forceinline__ int warp_inclusive_sum(int v, int lane) {
  for (int offset = 1; offset < 32; offset *= 2) {
    const int below = __shfl_up_sync(kFullWarp, v, offset);
    if (lane >= offset) v += below;
  }
  return v;
}

// out[i] = in[0] + ... + in[i - 1] for i <= n (out[n]: the total), by one whole warp, 32 entries
// at a time. `in` may be `out`: each entry is read, then written, by the same lane.
__device__ void warp_exclusive_scan(const int* in, int* out, int n, int lane) {
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

// The offsets and the prefix sums a warp-wide scan each (the host sums them on one thread:
// step_counts.hpp, sequential_prefix), then every table a thread per entry.
__global__ void __launch_bounds__(kCompilerThreads) compile_sequential_kernel(const int* counts, const int* offsets, int world,
                                                                             int experts, int* offset, int* rank_row, int* prefix,
                                                                             plan_detail::SequentialShape shape, PlanTables* plan) {
  const int thread = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  const int lane = thread % 32, warp = thread / 32, warps = threads / 32;
  const int L = experts / world;
  PlanTables tables = *plan;  // every thread's pointers and room; thread 0 writes the counts back at the end
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
  const plan_detail::StepCounts view{world, experts, L, offset, rank_row};
  // each GEMM's tiles per local expert, their prefix sums and the tiles that compute rows
  if (warp < 2) {
    const int layer = warp, col_tiles = plan_detail::sequential_column_tiles(shape, layer);
    int* first = prefix + layer * (L + 2);
    int running = 0, real = 0;
    for (int base = 0; base < L; base += 32) {
      const int e = base + lane;
      const GroupTiles g = e < L ? plan_detail::sequential_expert_tiles(view, shape, layer, e) : GroupTiles{};
      const int inclusive = warp_inclusive_sum(g.entries, lane);
      if (e < L) first[e] = running + inclusive - g.entries;
      running += __shfl_sync(kFullWarp, inclusive, 31);
      real += __shfl_sync(kFullWarp, warp_inclusive_sum(g.m_tiles * col_tiles, lane), 31);
    }
    if (lane == 0) {
      first[L] = running;
      first[L + 1] = real;
    }
  }
  __syncthreads();
  plan_detail::compile_sequential_tables(view, shape, prefix, tables, thread, threads);
  if (thread == 0) *plan = tables;
}

}  // namespace

void launch_compile_sequential(cudaStream_t stream, const int* counts, const int* offsets,
                               const plan_detail::SequentialShape& shape, const DevicePlanTables& plan) {
  if (counts == nullptr && offsets == nullptr) throw_internal("sequential device compiler: no counts");
  compile_sequential_kernel<<<1, kCompilerThreads, 0, stream>>>(counts, offsets, plan.world(), plan.experts(), plan.offset(),
                                                                plan.rank_row(), plan.prefix(), shape, plan.view());
  TILEMOE_CUDA_CHECK_LAUNCH("sequential plan compiler");
}

}  // namespace tilemoe::cuda
