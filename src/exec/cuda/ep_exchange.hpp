#pragma once
// The token exchange of one expert-parallel step, as plain data shared by the host and the
// kernels: the layout of every rank's symmetric region (identical on all ranks, so an offset
// means the same thing at every peer) and the arguments of the exchange kernels.
//
// Protocol of one step (epoch e = the step number, counted on the device, so CUDA-graph
// replays need no host help), kernels in stream order on every rank:
//  1. counts: rank r writes its per-expert row counts into every peer's counts inbox and raises
//     counts_flag[r] there to e; it waits for every peer's counts (this also proves the peer has
//     finished step e-1 with the buffers r is about to write), writes its receive table and
//     checks every rank's receive room (the same verdict on every rank: nobody sends).
//  2. the strategy's compiler builds the step's plan from the counts (src/strategies/*).
//  3. dispatch: the plan's dispatch segments (exec/cuda/segment_copy.hpp) store r's rows of
//     expert x straight into the owner's dispatch_rows at their final position (expert-major,
//     sources in rank order inside an expert) and raise the plan's arrival flags there
//     (segment_flags); the grid ends when GEMM0's flags are raised here.
//     With a dispatch once per destination rank (exec/cuda/send_lists.hpp), r sends each token
//     once to every other rank holding any of its experts, into that rank's received_rows, after
//     writing where each of its rows goes there into that rank's gather_rows (the placement
//     entries); the receiver's own segments then place the rows into dispatch_rows once the
//     source's arrival flag is up. Counts carry each rank's tokens per destination too.
//  4. the expert FFN runs on dispatch_rows.
//  5. sequential: the plan's combine segments store each output row back into its source's
//     returned_rows at the row's position in the source's own permuted order; the top-k combine
//     then reads returned_rows as the one-GPU layer reads y. tile_signal ships them during GEMM1
//     instead (exec/cuda/band_consumer.hpp) and raises each row's row_arrivals; the owner
//     combines each token once its rows are in (exec/cuda/arrival_combine.hpp).
// Everything before dispatch_rows is zeroed when a layer starts on the region.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "comm/cuda/device_transport.hpp"
#include "core/host_device.hpp"
#include "tilemoe/plan.hpp"

namespace tilemoe::cuda {

struct EpRegionLayout {
  std::size_t counts_inbox = 0;       // [world][experts] int32: counts_inbox[q][x] = rows rank q sends to expert x
  std::size_t counts_flag = 0;        // [world] u64, raised to the epoch by rank q
  // a dispatch once per destination rank (0 = absent):
  std::size_t rank_tokens_inbox = 0;  // [world][world] int32: [q][d] = tokens rank q sends rank d (StepCounts::rank_tokens)
  std::size_t gather_rows = 0;        // [gather_room] int32: this rank's plan's gather table (step_counts.hpp); its
                                      // placement entries are written by the sources, the rest by this rank
  std::size_t received_rows = 0;      // [received_capacity][hidden] bf16: the tokens other ranks sent, once each
  std::size_t expert_in_scale = 0;    // [receive_capacity] f32: each ExpertIn row's input scale, written by its
                                      // source (Llama-4's routing, exec/cuda/input_scale.hpp; 0 = absent)
  std::size_t segment_flags = 0;      // [segment_flag_count] u64: the plan's flags that segments raise,
                                      // counters that only grow (segment_copy.hpp)
  std::size_t row_arrivals = 0;       // [max_tokens * top_k] u64: tile_signal raises returned row i's to the epoch
                                      // once it landed (the owner combines a token when its k rows are in)
  std::size_t dispatch_rows = 0;      // [receive_capacity][hidden] bf16
  std::size_t returned_rows = 0;      // [max_tokens * top_k][hidden] bf16
  // Only in worlds with GIN peers, whose puts read from the window: the counts, permuted rows
  // and expert outputs this rank sends live in its region too (0 = absent).
  std::size_t counts_outbox = 0;      // [experts] int32
  std::size_t send_rows = 0;          // [max_tokens * top_k][hidden] bf16
  std::size_t expert_out = 0;         // [receive_capacity][hidden] bf16
  std::size_t bytes = 0;              // the whole region, a multiple of 4 KiB
  std::int64_t receive_capacity = 0;  // rows: every source's tokens times min(top_k, local experts), or less if asked
  std::int64_t received_capacity = 0;  // rows of received_rows: the other sources' tokens, at most receive_capacity
  std::int64_t gather_room = 0;        // entries of gather_rows
  int segment_flag_count = 0;          // flags in segment_flags
};

// The plan flags a segment may raise at a peer: sequential and tile_signal number their dispatch
// and combine arrivals below 3 W + 2 (sequential_plan.hpp; 2 W + 2 with a row per expert);
// comet's split arrivals need more, as many as its splits say (comet_plan.hpp).
TILEMOE_HOST_DEVICE constexpr int ep_segment_flag_room(int world) { return 3 * world + 2; }

// `remote_sources`: the world has GIN peers (several nodes), so the send side lives in the region.
// `receive_rows` > 0 caps the receive capacity below the dropless worst case (a step that
// would exceed it fails on every rank, nothing dropped). `volume`: the dispatch's, whose
// OncePerRank adds the rank token counts, the gather table and received_rows; `input_scales`
// the ExpertIn rows' input scales; `segment_flags` the flags segments may raise, if more than
// ep_segment_flag_room (a strategy's own numbering).
EpRegionLayout ep_region_layout(int world, std::int64_t experts, std::int64_t hidden, std::int64_t max_tokens,
                                std::int64_t top_k, bool remote_sources = false, std::int64_t receive_rows = 0,
                                DispatchVolume volume = DispatchVolume::RowPerExpert, bool input_scales = false,
                                int segment_flags = 0);

// This rank's device tables of a step, written by the counts kernel.
struct EpLocalTables {
  std::uint64_t* epoch = nullptr;      // [1] the step counter
  int* local_row_offset = nullptr;     // [local_experts + 1] rows of each local expert in dispatch_rows
};

struct EpExchangeArgs {
  EpRegionLayout layout;
  EpLocalTables tables;
  int experts = 0, local_experts = 0, hidden = 0;
  const int* row_offset = nullptr;        // [experts + 1] this rank's layout (its permuted rows by expert)
  const int* rank_tokens = nullptr;       // [world] the tokens this rank sends each rank once (send_lists.hpp);
                                          // null with a row per expert
  const std::byte* expert_out = nullptr;  // the FFN's output [receive rows][hidden] (the band consumer's source)
  bool silent = false;                    // fault injection: this rank sends nothing (tests)
};

// The kernels (src/exec/cuda/ep_exchange.cu). All bounded: a wait past the transport's timeout
// records a WaitFailure and the kernel returns; the host turns it into an error.
void launch_ep_begin_step(cudaStream_t stream, std::uint64_t* epoch);
// Worlds with GIN peers: zeroes this rank's exchange signals (a new layer's epochs start at 1).
// Before the world's host barrier, while no peer signals.
void launch_reset_gin_signals(cudaStream_t stream, const DeviceTransport& transport);
// Step 1 of the protocol, on one CTA.
void launch_ep_exchange_counts(cudaStream_t stream, const DeviceTransport& transport, const EpExchangeArgs& args);

// The host path's reorder: block b of `rows[b]` rows moves from src row src_start[b] to dst
// row dst_start[b]. `tables` is [3][blocks] on the device: src_start, dst_start, rows.
void launch_copy_row_blocks(cudaStream_t stream, const std::byte* src, std::byte* dst, int row_bytes, const int* tables,
                            int blocks);

// The exchange kernels' CTA (the counts kernel's and the segment copy's).
constexpr int kEpExchangeThreads = 512;

}  // namespace tilemoe::cuda
