#pragma once
// Real ranks: one process per GPU, through NCCL 2.28's device API. Every rank allocates its
// symmetric region with ncclMemAlloc and registers it as a symmetric window
// (NCCL_WIN_COLL_SYMMETRIC); a peer pointer is the peer's window as NCCL maps it into this
// process over NVLink or PCIe P2P (the LSA team), so the exchange kernels are the same as with
// virtual ranks. The host-API path is NCCL's all-gather and grouped send/receive.
//
// Start-up refuses, with a message that says what to change: NVLink multicast switched on
// (NCCL_NVLS_ENABLE is set to 0 when unset: tilemoe never uses multicast, and it can take
// shared GPUs out of service), an NCCL library other than the one tilemoe was compiled
// against (the device API has no stable ABI). Peers outside this rank's load/store domain
// (other nodes) are reached with NCCL's GIN puts and signals behind the same kernels; that
// path is compiled but untested (no multi-node machine with RDMA NICs here), and it needs the
// regions sized with EpMoeLayer::region_bytes(..., remote_peers = true). The communicator is
// created non-blocking, so that its set-up and every host collective are bounded by the timeout.
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "tilemoe/cuda/rank_transport.hpp"

namespace tilemoe::launch {
class Rendezvous;
}

namespace tilemoe::cuda {

struct NcclWorldOptions {
  std::chrono::milliseconds timeout{30000};  // bound of every device and host wait
};

class NcclWorld {
 public:
  // Collective over the ranks of `rendezvous` (which carries NCCL's unique id and serves as
  // the host barrier; it must outlive the world). `device` is this rank's GPU.
  NcclWorld(launch::Rendezvous& rendezvous, std::size_t region_bytes, int device, NcclWorldOptions options = {});
  ~NcclWorld();
  NcclWorld(const NcclWorld&) = delete;
  NcclWorld& operator=(const NcclWorld&) = delete;

  RankTransport& transport();

  // The checks the constructor makes before NCCL starts (callable on their own, e.g. at
  // program start): multicast off, the loaded NCCL equal to the compiled one.
  static void check_environment();
  // "2.28.9" of the library this process loaded, and of the headers tilemoe was built with.
  static std::string loaded_version();
  static std::string compiled_version();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tilemoe::cuda
