#pragma once
// The exchange kernels' path to peers on other nodes: NCCL's GPU-initiated networking (GIN).
// A put copies bytes from this rank's symmetric window to the peer's; a signal raised after a
// CTA's puts, on the same context, becomes visible at the peer only once those puts have
// landed (NCCL's ordering guarantee), so it plays the role of the release flag of the load/
// store path. Waits poll the signal with the same deadline and failure record as
// wait_at_least. Compiled, untested here (no multi-node machine, no RDMA NIC).
#include <nccl.h>
#include <nccl_device.h>

#include "comm/cuda/device_sync.cuh"

namespace tilemoe::cuda {

__device__ inline const ncclDevComm& gin_comm(const DeviceTransport& t) { return *static_cast<const ncclDevComm*>(t.gin_comm); }

// One thread: `bytes` at my window offset `src` into `peer`'s window at `dst`.
__device__ inline void gin_put(const DeviceTransport& t, int peer, std::size_t dst, std::size_t src, std::size_t bytes) {
  if (bytes == 0) return;
  const ncclDevComm& dc = gin_comm(t);
  ncclGin gin(dc, 0);  // one context for every put and signal: a signal orders only its own context's puts
  const auto window = static_cast<ncclWindow_t>(t.window);
  gin.put(ncclTeamWorld(dc), peer, window, dst, window, src, bytes);
}

// One thread: add `value` to signal `id` at `peer`, after this context's earlier puts to it.
__device__ inline void gin_signal_add(const DeviceTransport& t, int peer, unsigned id, std::uint64_t value) {
  const ncclDevComm& dc = gin_comm(t);
  ncclGin gin(dc, 0);
  gin.signal(ncclTeamWorld(dc), peer, ncclGin_SignalAdd{static_cast<ncclGinSignal_t>(id), value});
}

// One thread: this rank's signal `id` >= expected, bounded like wait_at_least.
__device__ inline bool gin_wait_at_least(const DeviceTransport& t, unsigned id, std::uint64_t expected, int peer,
                                         comm::WaitSubject subject, std::uint64_t step) {
  const ncclDevComm& dc = gin_comm(t);
  ncclGin gin(dc, 0);
  return bounded_wait(t, [&gin, id] { return gin.readSignal(static_cast<ncclGinSignal_t>(id)); }, expected, peer, subject, step);
}

// Either path: wait for `flag` (a load/store peer's release store or add) or signal `id`
// (a GIN peer's).
__device__ inline bool wait_peer(const DeviceTransport& t, const std::uint64_t* flag, unsigned id, std::uint64_t expected, int peer,
                                 comm::WaitSubject subject, std::uint64_t step) {
  if (t.region[peer] != nullptr) return wait_at_least(t, flag, expected, peer, subject, step);
  return gin_wait_at_least(t, id, expected, peer, subject, step);
}

}  // namespace tilemoe::cuda
