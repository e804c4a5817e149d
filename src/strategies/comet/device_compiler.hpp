#pragma once
// comet's compiler on the GPU: comet_plan.hpp's code path, right after the counts exchange, from
// the counts the step has exchanged: the prefix sums on one CTA (after the sequential ones,
// device_counts.cuh), then every table an entry per thread over a grid (as the sequential
// compiler).
#include <cuda_runtime.h>

#include "comet_plan.hpp"
#include "plan/device_plan_tables.hpp"

namespace tilemoe::cuda {

// The prefix entries comet needs past the sequential ones (DevicePlanTables' extra_prefix).
int comet_device_prefix(int world, int local_experts, int splits);

// Every rank's counts as `counts` [world][experts] (the device dispatch's inbox), and with a
// dispatch once per destination rank `rank_tokens` [world][world] (else null). Writes `plan`'s
// tables for shape.gemm.rank.
void launch_compile_comet(cudaStream_t stream, const int* counts, const int* rank_tokens, const plan_detail::CometShape& shape,
                          const DevicePlanTables& plan);

}  // namespace tilemoe::cuda
