#pragma once
// The owner's combine as a plan runner: a persistent grid walks the plan's combine tasks (a
// chunk of this rank's tokens x a range of hidden's columns each) in plan order, every task as
// soon as its waits are met (flags in the exchange's counters, raised at this rank by the
// segments that return the rows), and writes the top-k sum of its tokens' rows over its columns
// in top-k slot order (combine_vector.cuh): bitwise the sequential combine's output, whatever
// the tasks. It decides nothing: which columns wait for which ranks is the plan's (comet's
// splits, each combined as soon as every expert rank's split has landed, while the later
// splits are still on their way).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "exec/cuda/ep_exchange.hpp"
#include "tilemoe/plan.hpp"

namespace tilemoe::cuda {

struct PlanCombineArgs {
  EpRegionLayout layout;                 // where the returned rows and the flag counters sit
  const std::uint64_t* epoch = nullptr;  // this step's (device)
  const PlanTables* plan = nullptr;      // device: the step's plan
  int signals_per_count = 1;             // raises per counted segment (the exchange's CTAs per peer)
  const float* weight = nullptr;         // [tokens * top_k]
  const int* row_of_slot = nullptr;      // [tokens * top_k] where each slot's row returns (-1: dropped, none)
  int tokens = 0, top_k = 0, hidden = 0;
  int ctas = 1;                          // the persistent grid: all of them may wait at once
  __nv_bfloat16* output = nullptr;       // [tokens][hidden]
};

// A task whose waits name a flag the exchange does not count, or whose tokens or columns fall
// outside the step's, is recorded as WaitState::PlanInvalid and combines nothing.
void launch_plan_combine(cudaStream_t stream, const DeviceTransport& transport, const PlanCombineArgs& args);
// Its resident CTAs per SM, for sizing a grid that fits beside the other ranks' waiting kernels.
int plan_combine_ctas_per_sm();

}  // namespace tilemoe::cuda
