#include "device_compiler.hpp"

#include "strategies/sequential/device_counts.cuh"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

using device_compile::kPrefixThreads;

// The counts (device_counts.cuh: its sequential prefix sums are left unused), then comet's
// prefix sums after them: the bands per expert by one warp, the GEMM0 places per (wave, expert)
// by another (each value O(W): where the ring blocks end), then the GEMM1
// entries per split on one thread.
__global__ void __launch_bounds__(kPrefixThreads) comet_prefix_kernel(const int* counts, int world, int experts, int* offset,
                                                                     int* rank_row, int* prefix, plan_detail::CometShape shape) {
  const plan_detail::StepCounts c =
      device_compile::counts_and_prefix(counts, nullptr, nullptr, world, experts, offset, rank_row, prefix, shape.gemm);
  const int W = c.world, L = c.local_experts, r = shape.gemm.rank, tm = static_cast<int>(shape.gemm.tile_m);
  const int splits = plan_detail::comet_splits(shape);
  int* out = prefix + plan_detail::sequential_prefix_size(L);
  const plan_detail::CometPrefix x = plan_detail::comet_prefix_view(out, W, L);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (warp == 0) {
    device_compile::warp_exclusive_prefix(L, out, lane, [&](int e) { return tile_ceil_div(c.local_rows(r, e), tm); });
  } else if (warp == 1) {
    int* order_first = out + L + 1;
    device_compile::warp_exclusive_prefix(W * L, order_first, lane,
                                          [&](int g) { return plan_detail::comet_wave_bands(c, r, g % L, g / L, tm); });
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int* gemm1_first = out + (L + 1) + (W * L + 1);
    const int bands = x.band_first[L];
    int entries = 0;
    for (int split = 0; split < splits; ++split) {
      gemm1_first[split] = entries;
      entries += bands * plan_detail::comet_band_entries(shape, plan_detail::comet_split_tiles(shape, split));
    }
    gemm1_first[splits] = entries;
  }
}

}  // namespace

// The tables kernel's part: comet's compiler at the layer's shape, on the prefix sums past the
// sequential ones (outside the anonymous namespace: a kernel template's argument needs external
// linkage).
struct CometCompile {
  plan_detail::CometShape shape;
  __device__ void operator()(const plan_detail::StepCounts& counts, const int* prefix, PlanTables& tables, int lane, int lanes) const {
    plan_detail::compile_comet_tables(counts, shape, prefix + plan_detail::sequential_prefix_size(counts.local_experts), tables, lane, lanes);
  }
};

int comet_device_prefix(int world, int local_experts, int splits) {
  return plan_detail::comet_prefix_size(world, local_experts, splits);
}

void launch_compile_comet(cudaStream_t stream, const int* counts, const int* rank_tokens, const plan_detail::CometShape& shape,
                          const DevicePlanTables& plan) {
  if (counts == nullptr) throw_internal("comet device compiler: no counts");
  if ((rank_tokens != nullptr) != plan_detail::once_per_rank(shape.gemm)) throw_internal("comet device compiler: rank token counts");
  const int L = plan.experts() / plan.world();
  if (plan_detail::sequential_prefix_size(L) + comet_device_prefix(plan.world(), L, plan_detail::comet_splits(shape)) > plan.prefix_size()) {
    throw_internal("comet device compiler: the plan's prefix room is too small");
  }
  comet_prefix_kernel<<<1, kPrefixThreads, 0, stream>>>(counts, plan.world(), plan.experts(), plan.offset(), plan.rank_row(), plan.prefix(),
                                                        shape);
  TILEMOE_CUDA_CHECK_LAUNCH("comet plan compiler (prefix sums)");
  device_compile::launch_plan_tables(stream, plan, rank_tokens, CometCompile{shape}, "comet plan compiler (tables)");
}

}  // namespace tilemoe::cuda
