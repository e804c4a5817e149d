#pragma once
// The transport as the communication kernels see it: a plain struct passed by value to every
// kernel. Every rank has one symmetric region (the same size and layout on all ranks); a peer
// pointer is that rank's region, reachable with ordinary loads and stores (NVLink/PCIe P2P for
// NCCL's LSA windows, sibling memory for virtual ranks on one GPU). The same kernels run on
// every implementation: only how the regions were obtained differs.
#include <cstddef>
#include <cstdint>

#include "comm/wait_failure.hpp"

namespace tilemoe::cuda {

constexpr int kMaxRanks = 16;  // ranks of one load/store domain (a node's GPUs; virtual ranks)

// The first bytes of every symmetric region belong to the transport: at 0 the abort word that
// a failing rank raises at its peers so that their waits give up at once instead of each
// running into its own deadline; at kFailureRecordOffset the rank's WaitFailure, where every
// peer (and the host, through the peer pointers) can read why it stopped.
constexpr std::size_t kTransportHeaderBytes = 256;
constexpr std::size_t kFailureRecordOffset = 64;

struct DeviceTransport {
  int rank = 0;
  int world = 1;
  std::byte* region[kMaxRanks] = {};   // region[p]: rank p's symmetric region as this rank addresses it
  comm::WaitFailure* failure = nullptr;  // this rank's record: region[rank] + kFailureRecordOffset
  std::uint64_t timeout_ns = 0;        // bound of every wait
  // Link emulation: bytes per nanosecond that this rank may send to other ranks (0 = as fast
  // as the hardware goes). Senders pace themselves; copies to self are never paced.
  double link_bytes_per_ns = 0.0;
  // Peers outside this rank's load/store domain (other nodes; NCCL worlds only): their
  // region[p] is null and the kernels reach them with GIN puts and signals instead
  // (src/comm/cuda/gin_transport.cuh). Compiled, but untested: no multi-node machine here.
  const void* gin_comm = nullptr;  // device copy of the world's ncclDevComm; null: no GIN peers
  void* window = nullptr;          // ncclWindow_t of the symmetric regions (puts address it by offset)
};

// GIN signal ids (NcclWorld requests kGinSignalCount): the dispatch counts, one signal per source
// rank so that a wait names the peer it waits for; then the plan's flags that segments raise,
// one signal per flag id (EpRegionLayout::segment_flags: at most 2 x kMaxRanks + 2 of them).
constexpr unsigned kGinCountsSignal = 0;
constexpr unsigned kGinSegmentFlagSignal = kMaxRanks;
constexpr unsigned kGinSignalCount = kGinSegmentFlagSignal + 2 * kMaxRanks + 2;

}  // namespace tilemoe::cuda
