#pragma once
// The tables a dispatch once per destination rank needs on the GPU besides the plan (DeepEP's
// volume: a token goes once to each other rank that holds any of its experts, and that rank
// places it for each of its experts the token chose). Two kernels, in stream order:
//  1. before the counts exchange, on one CTA: from the step's routing, how many of this rank's
//     tokens go to each rank (StepCounts::rank_tokens, which the counts kernel sends every rank),
//     each token's position in its destination's list, and this rank's gather table up to its
//     send lists (step_counts.hpp: the token of each permuted row, then each destination's
//     tokens ascending), which the segment copy gathers Input rows through;
//  2. after the plan's compile, a thread per kept permuted row: a row of another rank's expert says
//     where its token's copy sits in that rank's Received, written into that rank's gather table
//     as the placement entry of the ExpertIn row the token takes there. It runs before the
//     segment copy raises the Received arrival flag the receiver's placements wait for, and
//     ends with a system-scope fence, so the receiver reads the entries complete.
// The receiver could derive the entries itself if the routing travelled with the tokens
// (DeepEP's way); the source has them at hand and they are 4 bytes a row.
#include <cuda_runtime.h>

#include <cstdint>

#include "comm/cuda/device_transport.hpp"
#include "exec/cuda/ep_exchange.hpp"
#include "plan/step_counts.hpp"

namespace tilemoe::cuda {

struct SendListArgs {
  const std::int32_t* expert = nullptr;  // [tokens][top_k] the step's routing
  const int* slot_of_row = nullptr;      // [tokens * top_k] the slot of each permuted row
  const int* row_of_slot = nullptr;      // [tokens * top_k] its inverse, -1 for a slot the capacity rule dropped
  const int* kept_rows = nullptr;        // device [1]: the permuted rows kept (the layout's row_offset[experts]),
                                         // where the send lists start in the gather table
  int tokens = 0, top_k = 0, local_experts = 0;
  int* rank_tokens = nullptr;    // out [world]
  int* list_position = nullptr;  // out [tokens][world]: token t's row in the list for d, -1 if not sent there
  int* gather_rows = nullptr;    // out: this rank's gather table (its region), gather_room entries
  std::int64_t gather_room = 0;
};
void launch_send_lists(cudaStream_t stream, const DeviceTransport& transport, const SendListArgs& args);

struct PlacementArgs {
  EpRegionLayout layout;
  // every rank's counts on the device: the compile's scratch (offset, rank_row) and the rank
  // token counts the exchange brought (rank_tokens_inbox)
  plan_detail::StepCounts counts;
  plan_detail::DispatchOrder order = plan_detail::DispatchOrder::Ascending;  // the plan's ExpertIn layout
  const std::int32_t* expert = nullptr;
  const int* slot_of_row = nullptr;
  const int* list_position = nullptr;  // send lists' output
  int tokens = 0, top_k = 0;
  const std::uint64_t* epoch = nullptr;  // for a failure's record
};
void launch_write_placements(cudaStream_t stream, const DeviceTransport& transport, const PlacementArgs& args);

}  // namespace tilemoe::cuda
