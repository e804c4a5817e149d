#pragma once
// One rank's handle on an expert-parallel world of GPUs: its symmetric region (what the
// device-API exchange kernels address), the host-API collectives (the baseline path that
// synchronises with the host on counts), and the failure records of the device waits.
// Implementations: VirtualWorld (N ranks on one GPU, include/tilemoe/cuda/virtual_world.hpp)
// and NcclWorld (one process per GPU through NCCL, include/tilemoe/cuda/nccl_world.hpp).
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

namespace tilemoe::cuda {

struct DeviceTransport;  // the kernels' view (src/comm/cuda/device_transport.hpp)

// The host-API path: collectives enqueued on the caller's stream whose sizes the host knows.
class HostExchange {
 public:
  virtual ~HostExchange() = default;
  // gathered[q * count + i] = rank q's values[i]; device buffers.
  virtual void all_gather(cudaStream_t stream, const int* values, int count, int* gathered) = 0;
  // For every peer p: send_bytes[p] bytes at send + send_offset[p] go to p, which stores them at
  // its recv + its recv_offset[me] (recv_bytes[q] from each q). Device buffers; sizes must match
  // pairwise (the caller derives both sides from the same gathered counts).
  virtual void all_to_all(cudaStream_t stream, const void* send, const std::vector<std::size_t>& send_offset,
                          const std::vector<std::size_t>& send_bytes, void* recv, const std::vector<std::size_t>& recv_offset,
                          const std::vector<std::size_t>& recv_bytes) = 0;
};

// The streams of a rank, made by its world. Ranks sharing a GPU share its hardware work queues
// (CUDA_DEVICE_MAX_CONNECTIONS, at most 32; streams take them round robin in creation order):
// a rank's kernel that waits for a peer, queued on a shared queue ahead of the peer's kernel it
// waits for, blocks that kernel until the timeout. A world makes all its ranks' streams in one
// batch, so that up to 32 of them take distinct queues, and the layers of a world whose ranks
// share a GPU run on these streams only (measured: an 8-rank test stalled intermittently on
// streams made by the ranks' threads).
enum class RankStream {
  Main,      // the rank's forward steps: pass it to EpMoeLayer::forward
  Consumer,  // the tile-signal consumer (high priority)
  Setup,     // set-up copies and read-backs that must not wait for the rank's steps
};

class RankTransport {
 public:
  virtual ~RankTransport() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual int device() const = 0;
  virtual std::size_t region_bytes() const = 0;
  // How many ranks of this world share this rank's GPU (and so its CUDA context and legacy
  // stream: ranks sharing a GPU need non-blocking streams).
  virtual int ranks_per_device() const = 0;
  // The SMs this rank's kernels run on, and how many ranks' kernels share them: the exchange
  // kernels of all those ranks must be resident at once (they wait for each other).
  virtual int sm_count() const = 0;
  virtual int ranks_sharing_sms() const = 0;
  // Binds the calling host thread to this rank's GPU, and to its SM partition if the world has
  // them: call it first in the thread that drives the rank; streams the thread creates
  // afterwards run on the rank's SMs.
  virtual void bind_thread() = 0;
  // The rank's outgoing link for the SM split's cost model, bytes/s; 0: not the limit (virtual
  // ranks without link emulation, where the GPU's memory is the link).
  virtual double link_bytes_per_s() const = 0;
  // Non-blocking streams owned by the world, valid while it lives; with SM partitions they run
  // on the rank's SMs.
  virtual cudaStream_t stream(RankStream which) const = 0;
  virtual const DeviceTransport& device_view() const = 0;
  virtual HostExchange& host_exchange() = 0;
  // All ranks meet on the host; bounded by the world's timeout (a Timeout error names who is
  // missing where the implementation can tell).
  virtual void host_barrier() = 0;
  // Waits for `stream`, at most `waits` times the world's timeout plus a second (the bound of
  // that many device waits in a row, so that their own records, which name the stalled rank,
  // win the race): a collective whose peer died would otherwise block the host forever. A
  // Timeout error says what was awaited; the implementation stops its in-flight
  // communication first where it can (NCCL: abort).
  virtual void synchronize(cudaStream_t stream, const char* what, int waits = 1) = 0;
  // Throws what the device waits of this world recorded (the timed-out waits name the rank
  // that stalled); does nothing if all are clear. Call after the rank's stream is synchronised.
  virtual void throw_if_failed() const = 0;
};

}  // namespace tilemoe::cuda
