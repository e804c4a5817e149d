#pragma once
// Llama-4's routing on the GPU (RouterConfig::scales_input): a slot's weight scales the expert's
// input, round(x * w) in bf16, as the CPU engine's GEMM0 scales a row of the plan's
// expert_in_scale as it loads it. Two kernels, in stream order:
//  1. with the counts known (after the plan's compile; a world of one after its layout), a
//     thread per kept permuted row writes its slot's weight at its destination, into that
//     rank's expert_in_scale at the ExpertIn row the token takes there (the same index as a
//     placement entry's), then fences at system scope: the dispatch's release of the rows, a
//     later kernel, publishes it with them, whichever volume sends the row;
//  2. once every row is in ExpertIn (after the dispatch's grid), each ExpertIn row is scaled in
//     place by its entry, before GEMM0 reads it.
// The combine then weighs every expert's output by 1 (the layer passes it weights of one).
#include <cuda_runtime.h>

#include <cstdint>

#include "comm/cuda/device_transport.hpp"
#include "exec/cuda/ep_exchange.hpp"
#include "plan/step_counts.hpp"

namespace tilemoe::cuda {

struct InputScaleArgs {
  EpRegionLayout layout;  // its expert_in_scale and dispatch_rows
  // every rank's counts on the device (the compile's scratch; a world of one: its row_offset
  // as both offset and rank_row)
  plan_detail::StepCounts counts;
  plan_detail::DispatchOrder order = plan_detail::DispatchOrder::Ascending;
  const std::int32_t* expert = nullptr;
  const float* weight = nullptr;  // the router's weights, [tokens][top_k]
  const int* slot_of_row = nullptr;
  int tokens = 0, top_k = 0, hidden = 0;
  const int* expert_rows = nullptr;  // device [1]: this rank's ExpertIn rows this step (the receive table's last entry)
  std::int64_t row_bound = 0;        // the most rows ExpertIn holds
};

void launch_write_input_scales(cudaStream_t stream, const DeviceTransport& transport, const InputScaleArgs& args);
void launch_scale_expert_rows(cudaStream_t stream, const DeviceTransport& transport, const InputScaleArgs& args);

}  // namespace tilemoe::cuda
