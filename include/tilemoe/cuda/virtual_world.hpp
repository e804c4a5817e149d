#pragma once
// Virtual ranks: an expert-parallel world of N ranks inside one process on one GPU, so every
// multi-rank protocol runs (and is tested) on a single GPU with the same kernels as on real
// ranks. A rank's symmetric region is a sibling slice of one allocation; each rank is driven by
// its own host thread and streams, exactly like a process per GPU. Optionally the ranks'
// communication kernels pace themselves to a per-rank link bandwidth, to approach the
// compute/communication balance of a real N-GPU node.
#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "tilemoe/cuda/rank_transport.hpp"

namespace tilemoe::cuda {

struct VirtualWorldOptions {
  std::chrono::milliseconds timeout{10000};  // bound of every device and host wait
  double link_gbps = 0.0;                    // per-rank outgoing bandwidth, GB/s; 0 = unpaced
  // > 0: each rank gets its own partition of at least this many SMs (CUDA green contexts), as
  // if it had a GPU of its own; its thread enters it with RankTransport::bind_thread().
  // 0: all ranks share the whole GPU.
  int sms_per_rank = 0;
};

class VirtualWorld {
 public:
  // `region_bytes` per rank (EpMoeLayer::region_bytes says how much a layer needs); zeroed.
  // Needs eager module loading (include/tilemoe/cuda/module_loading.hpp): bad input otherwise.
  VirtualWorld(int ranks, std::size_t region_bytes, int device = 0, VirtualWorldOptions options = {});
  ~VirtualWorld();
  VirtualWorld(const VirtualWorld&) = delete;
  VirtualWorld& operator=(const VirtualWorld&) = delete;

  int size() const;
  RankTransport& rank(int r);
  // Runs `body` with each rank's transport on a thread of its own and waits for all of them;
  // returns each rank's exception (null where the body finished). A rank whose body throws
  // abandons the world before its thread ends: peers at a host barrier (or arriving at one
  // later) fail at once with an error of its error's kind that names it and its reason, instead
  // of waiting out the timeout for a rank that will never come. (Device-side waits stay bounded
  // by the timeout.)
  std::vector<std::exception_ptr> run_ranks(const std::function<void(RankTransport&)>& body);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tilemoe::cuda
