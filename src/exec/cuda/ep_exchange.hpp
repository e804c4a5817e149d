#pragma once
// The token exchange of one expert-parallel step, as plain data shared by the host and the
// kernels: the layout of every rank's symmetric region (identical on all ranks, so an offset
// means the same thing at every peer) and the arguments of the exchange kernels.
//
// Protocol of one step (epoch e = the step number, counted on the device, so CUDA-graph
// replays need no host help), kernels in stream order on every rank:
//  1. dispatch: rank r writes its per-expert row counts into every peer's counts inbox and
//     raises counts_flag[r] there to e; it waits for every peer's counts (this also proves the
//     peer has finished step e-1 with the buffers r is about to write); it then stores its
//     rows of expert x straight into the owner's dispatch_rows at their final position
//     (expert-major, sources in rank order inside an expert) and adds 1 per CTA to
//     dispatch_arrivals[r] at the owner; it waits for all peers' rows to arrive.
//  2. the expert FFN runs on dispatch_rows (row_offset from the counts, on the device).
//  3. combine send: the owner stores each output row back into its source's returned_rows at
//     the row's position in the source's own permuted order, adds 1 per CTA to
//     combine_arrivals[owner] at the source, and waits for all its own rows to return.
//  4. the ordinary combine (top-k slot order) reads returned_rows as the one-GPU layer reads y.
// The tile-signal overlap replaces 3 and 4 (exec/cuda/band_consumer.hpp, exec/cuda/arrival_combine.hpp): its consumer ships rows during
// GEMM1 and raises each row's row_arrivals; the owner combines each token once its rows are in.
// Everything before dispatch_rows is zeroed when a layer starts on the region.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "comm/cuda/device_transport.hpp"

namespace tilemoe::cuda {

struct EpRegionLayout {
  std::size_t counts_inbox = 0;       // [world][experts] int32: counts_inbox[q][x] = rows rank q sends to expert x
  std::size_t counts_flag = 0;        // [world] u64, raised to the epoch by rank q
  std::size_t dispatch_arrivals = 0;  // [world] u64, + ctas_per_peer per step from rank q
  std::size_t combine_arrivals = 0;   // [world] u64, + ctas_per_peer per step from rank q
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
};

// `remote_sources`: the world has GIN peers (several nodes), so the send side lives in the region.
// `receive_rows` > 0 caps the receive capacity below the dropless worst case (a step that
// would exceed it fails on every rank, nothing dropped).
EpRegionLayout ep_region_layout(int world, std::int64_t experts, std::int64_t hidden, std::int64_t max_tokens,
                                std::int64_t top_k, bool remote_sources = false, std::int64_t receive_rows = 0);

// This rank's device tables of a step, written by the dispatch kernel.
struct EpLocalTables {
  std::uint64_t* epoch = nullptr;      // [1] the step counter
  int* local_row_offset = nullptr;     // [local_experts + 1] rows of each local expert in dispatch_rows
  int* block_offset = nullptr;         // [local_experts * world + 1] start of (local expert, source) blocks
  int* return_offset = nullptr;        // [local_experts * world] where block (le, q) goes in q's returned_rows
};

struct EpExchangeArgs {
  EpRegionLayout layout;
  EpLocalTables tables;
  int experts = 0, local_experts = 0, hidden = 0;
  int ctas_per_peer = 1;               // the grid is world * ctas_per_peer CTAs, one group per destination
  const int* row_offset = nullptr;     // [experts + 1] this rank's layout (its permuted rows by expert)
  const std::byte* send_rows = nullptr;  // dispatch: this rank's permuted rows [slots][hidden]
  const std::byte* expert_out = nullptr; // combine send: the FFN's output [receive rows][hidden]
  // With GIN peers these two must be the region's send_rows and expert_out (puts read the window).
  bool silent = false;                 // fault injection: this rank sends nothing (tests)
};

// The kernels (src/exec/cuda/ep_exchange.cu). All bounded: a wait past the transport's timeout
// records a WaitFailure and the kernel returns; the host turns it into an error.
void launch_ep_begin_step(cudaStream_t stream, std::uint64_t* epoch);
// Worlds with GIN peers: zeroes this rank's exchange signals (a new layer's epochs start at 1).
// Before the world's host barrier, while no peer signals.
void launch_reset_gin_signals(cudaStream_t stream, const DeviceTransport& transport);
void launch_ep_dispatch(cudaStream_t stream, const DeviceTransport& transport, const EpExchangeArgs& args);
void launch_ep_combine_send(cudaStream_t stream, const DeviceTransport& transport, const EpExchangeArgs& args);

// The host path's reorder: block b of `rows[b]` rows moves from src row src_start[b] to dst
// row dst_start[b]. `tables` is [3][blocks] on the device: src_start, dst_start, rows.
void launch_copy_row_blocks(cudaStream_t stream, const std::byte* src, std::byte* dst, int row_bytes, const int* tables,
                            int blocks);

// The exchange kernels' CTA: its resident count per SM bounds how many ranks' kernels can
// wait for each other on one GPU at once.
constexpr int kEpExchangeThreads = 512;
int ep_exchange_ctas_per_sm(int world, int experts);

}  // namespace tilemoe::cuda
