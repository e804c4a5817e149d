#include "tilemoe/cuda/nccl_world.hpp"

#include <nccl.h>
#include <nccl_device.h>

#include <cstdlib>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

#include "comm/cuda/bounded_sync.hpp"
#include "comm/cuda/device_transport.hpp"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/launch/rendezvous.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

std::string version_text(int code) {
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." + std::to_string(code % 100);
}

// The one place that turns NCCL results into errors. With a non-blocking communicator a call
// may answer ncclInProgress: then its completion is polled, bounded by the deadline.
class NcclCalls {
 public:
  NcclCalls(int rank, std::chrono::milliseconds timeout) : rank_(rank), timeout_(timeout) {}
  void set_comm(ncclComm_t comm) { comm_ = comm; }

  // A call on a non-blocking communicator may return ncclSuccess or ncclInProgress while the
  // communicator is still busy with it: it is done only when the communicator's state says so.
  void operator()(ncclResult_t result, const char* what) const {
    if ((result == ncclSuccess || result == ncclInProgress) && comm_ != nullptr) result = wait_done(what);
    if (result != ncclSuccess) fail(result, what);
  }
  // Calls inside ncclGroupStart/End only queue: the group's end is what completes.
  void queued(ncclResult_t result, const char* what) const {
    if (result != ncclSuccess && result != ncclInProgress) fail(result, what);
  }

 private:
  ncclResult_t wait_done(const char* what) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress) {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) return ncclInternalError;
      if (state != ncclInProgress) break;
      if (std::chrono::steady_clock::now() > deadline) {
        throw Error(ErrorKind::Timeout, "rank " + std::to_string(rank_) + ": " + what + " did not finish within " +
                                            std::to_string(timeout_.count()) + " ms: a peer rank stalled, died or never joined");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return state;
  }

  [[noreturn]] void fail(ncclResult_t result, const char* what) const {
    std::string text = "rank " + std::to_string(rank_) + ": " + what + " failed: " + ncclGetErrorString(result);
    if (comm_ != nullptr) {
      const char* last = ncclGetLastError(comm_);
      if (last && *last) text += std::string(" (") + last + ")";
    }
    if (result == ncclInvalidArgument || result == ncclInvalidUsage) throw_bad_input(text);
    throw_internal(text);
  }

  int rank_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
};

// The peer pointers are device-side arithmetic on the window: one thread per rank asks.
// Peers outside this rank's LSA team get null: the kernels reach them through GIN.
__global__ void resolve_peers_kernel(ncclDevComm dc, ncclWindow_t window, int ranks, std::byte** out) {
  const int p = threadIdx.x;
  if (p >= ranks) return;
  const bool load_store = ncclTeamRankIsMember(ncclTeamLsa(dc), ncclTeamWorld(dc), p);
  out[p] = load_store ? static_cast<std::byte*>(ncclGetPeerPointer(window, 0, p)) : nullptr;
}

// Every rank's failure record, read through the peer pointers.
__global__ void gather_failures_kernel(DeviceTransport t, comm::WaitFailure* out) {
  const int p = threadIdx.x;
  if (p >= t.world) return;
  // a GIN peer's record is not reachable by loads: it reports its own failure on its node
  out[p] = t.region[p] != nullptr ? *reinterpret_cast<const comm::WaitFailure*>(t.region[p] + kFailureRecordOffset)
                                  : comm::WaitFailure{};
}

}  // namespace

struct NcclWorld::Impl final : RankTransport, HostExchange {
  launch::Rendezvous& rendezvous;
  std::size_t bytes;
  int gpu;
  NcclWorldOptions options;
  NcclCalls call;
  ncclComm_t comm = nullptr;
  void* region = nullptr;
  ncclWindow_t window = nullptr;
  ncclDevComm dev_comm{};
  bool dev_comm_made = false;
  DeviceTransport view;
  cudaStream_t readback = nullptr;  // RankStream::Setup
  cudaStream_t main = nullptr, consumer = nullptr;
  comm::WaitFailure* failure_copies = nullptr;  // [world] device scratch for throw_if_failed
  ncclDevComm* dev_comm_copy = nullptr;          // in device memory, for the GIN kernels (worlds across nodes)

  Impl(launch::Rendezvous& r, std::size_t region_bytes, int dev, NcclWorldOptions o)
      : rendezvous(r), bytes(region_bytes), gpu(dev), options(o), call(r.rank(), o.timeout) {}

  ~Impl() override {
    for (cudaStream_t s : {readback, main, consumer}) {
      if (s) cudaStreamDestroy(s);
    }
    if (failure_copies) cudaFree(failure_copies);
    if (dev_comm_copy) cudaFree(dev_comm_copy);
    if (comm == nullptr) {  // never made, or aborted after a peer failed
      if (region) ncclMemFree(region);
      return;
    }
    // a clean teardown, collective; if a peer is gone it cannot finish: abort instead
    bool clean = true;
    try {
      if (dev_comm_made) call(ncclDevCommDestroy(comm, &dev_comm), "ncclDevCommDestroy");
      if (window) call(ncclCommWindowDeregister(comm, window), "ncclCommWindowDeregister");
      call(ncclCommFinalize(comm), "ncclCommFinalize");
    } catch (const Error&) {
      clean = false;
    }
    if (clean) {
      ncclCommDestroy(comm);
    } else {
      ncclCommAbort(comm);
    }
    if (region) ncclMemFree(region);
  }

  int rank() const override { return rendezvous.rank(); }
  int world_size() const override { return rendezvous.world_size(); }
  int device() const override { return gpu; }
  std::size_t region_bytes() const override { return bytes; }
  int ranks_per_device() const override { return 1; }
  int sm_count() const override {
    int sms = 0;
    TILEMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, gpu));
    return sms;
  }
  int ranks_sharing_sms() const override { return 1; }
  void bind_thread() override { TILEMOE_CUDA_CHECK(cudaSetDevice(gpu)); }
  // NCCL's effective all-to-all ceiling over H200 NVLink, ~370 GB/s per GPU (the line rate is
  // 450); TILEMOE_LINK_GBPS overrides it for other machines.
  double link_bytes_per_s() const override {
    const char* given = std::getenv("TILEMOE_LINK_GBPS");
    const double gbps = given && *given ? std::atof(given) : 370.0;
    return gbps > 0.0 ? gbps * 1e9 : 0.0;
  }
  cudaStream_t stream(RankStream which) const override {
    return which == RankStream::Main ? main : which == RankStream::Consumer ? consumer : readback;
  }
  const DeviceTransport& device_view() const override { return view; }
  HostExchange& host_exchange() override { return *this; }
  void host_barrier() override { rendezvous.barrier(); }

  // A peer that died leaves NCCL's kernels waiting for it: after the timeout the communicator
  // is aborted (which ends them) and the step fails naming what was awaited.
  void synchronize(cudaStream_t stream, const char* what, int waits) override {
    const auto bound = waits * options.timeout + std::chrono::milliseconds(1000);
    const bool done = wait_for_stream(stream, bound, [&] {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress) {
        throw_internal("rank " + std::to_string(rank()) + ": NCCL failed while waiting for " + what + ": " + ncclGetErrorString(state));
      }
    });
    if (!done) {
      ncclCommAbort(comm);
      comm = nullptr;
      call.set_comm(nullptr);
      throw Error(ErrorKind::Timeout, "rank " + std::to_string(rank()) + " waited " + std::to_string(bound.count()) +
                                          " ms for " + what + ": a peer rank stalled or died (the NCCL communicator was aborted)");
    }
  }

  void throw_if_failed() const override {
    std::vector<comm::WaitFailure> records(static_cast<std::size_t>(view.world));
    gather_failures_kernel<<<1, 32, 0, readback>>>(view, failure_copies);
    TILEMOE_CUDA_CHECK_LAUNCH("gather failure records");
    TILEMOE_CUDA_CHECK(cudaMemcpyAsync(records.data(), failure_copies, records.size() * sizeof(comm::WaitFailure),
                                       cudaMemcpyDeviceToHost, readback));
    TILEMOE_CUDA_CHECK(cudaStreamSynchronize(readback));
    comm::throw_if_failed(records);
  }

  void all_gather(cudaStream_t stream, const int* values, int count, int* gathered) override {
    call(ncclAllGather(values, gathered, static_cast<std::size_t>(count), ncclInt32, comm, stream), "ncclAllGather");
  }

  void all_to_all(cudaStream_t stream, const void* send, const std::vector<std::size_t>& send_offset,
                  const std::vector<std::size_t>& send_bytes, void* recv, const std::vector<std::size_t>& recv_offset,
                  const std::vector<std::size_t>& recv_bytes) override {
    const auto n = static_cast<std::size_t>(world_size());
    if (send_offset.size() != n || send_bytes.size() != n || recv_offset.size() != n || recv_bytes.size() != n) {
      throw_internal("all_to_all: one offset and size per rank expected");
    }
    const auto* source = static_cast<const char*>(send);
    auto* target = static_cast<char*>(recv);
    call.queued(ncclGroupStart(), "ncclGroupStart");
    for (std::size_t p = 0; p < n; ++p) {
      if (send_bytes[p] > 0) {
        call.queued(ncclSend(source + send_offset[p], send_bytes[p], ncclChar, static_cast<int>(p), comm, stream), "ncclSend");
      }
      if (recv_bytes[p] > 0) {
        call.queued(ncclRecv(target + recv_offset[p], recv_bytes[p], ncclChar, static_cast<int>(p), comm, stream), "ncclRecv");
      }
    }
    call(ncclGroupEnd(), "the all-to-all (ncclGroupEnd)");
  }
};

std::string NcclWorld::compiled_version() { return version_text(NCCL_VERSION_CODE); }

std::string NcclWorld::loaded_version() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "unknown";
  return version_text(code);
}

void NcclWorld::check_environment() {
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  if (nvls == nullptr) {
    setenv("NCCL_NVLS_ENABLE", "0", 1);  // before NCCL reads it (at its first communicator)
  } else if (std::strcmp(nvls, "0") != 0) {
    throw_bad_input(std::string("NCCL_NVLS_ENABLE=") + nvls +
                    ": tilemoe never uses NVLink multicast, which can take shared GPUs out of service; set it to 0 or unset it");
  }
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) throw_internal("ncclGetVersion failed");
  if (code != NCCL_VERSION_CODE) {
    throw_bad_input("tilemoe was compiled against NCCL " + compiled_version() + " but this process loaded NCCL " +
                    version_text(code) + "; NCCL's device API has no stable ABI: put the libnccl.so.2 of NCCL " +
                    compiled_version() + " first on LD_LIBRARY_PATH");
  }
}

NcclWorld::NcclWorld(launch::Rendezvous& rendezvous, std::size_t region_bytes, int device, NcclWorldOptions options)
    : impl_(std::make_unique<Impl>(rendezvous, region_bytes, device, options)) {
  check_environment();
  Impl& m = *impl_;
  const int n = rendezvous.world_size(), me = rendezvous.rank();
  if (n > kMaxRanks) throw_bad_input("a load/store world has at most " + std::to_string(kMaxRanks) + " ranks, not " + std::to_string(n));
  if (region_bytes < kTransportHeaderBytes || region_bytes % 4096 != 0) {
    throw_bad_input("an NCCL window of " + std::to_string(region_bytes) + " bytes is not a multiple of 4 KiB");
  }
  if (options.timeout.count() <= 0) throw_bad_input("the NCCL world's timeout must be positive");
  TILEMOE_CUDA_CHECK(cudaSetDevice(device));
  TILEMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&m.readback, cudaStreamNonBlocking));
  TILEMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&m.main, cudaStreamNonBlocking));
  int lowest = 0, highest = 0;
  TILEMOE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
  TILEMOE_CUDA_CHECK(cudaStreamCreateWithPriority(&m.consumer, cudaStreamNonBlocking, highest));
  TILEMOE_CUDA_CHECK(cudaMalloc(&m.failure_copies, sizeof(comm::WaitFailure) * kMaxRanks));

  // the unique id travels through tilemoe's rendezvous (no MPI needed)
  ncclUniqueId id{};
  if (me == 0) m.call(ncclGetUniqueId(&id), "ncclGetUniqueId");
  const auto shared = rendezvous.broadcast_from_root(std::as_bytes(std::span(&id, 1)));
  if (shared.size() != sizeof id) throw_internal("the rendezvous delivered a unique id of " + std::to_string(shared.size()) + " bytes");
  std::memcpy(&id, shared.data(), sizeof id);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every collective set-up step can then be bounded by our timeout
  ncclResult_t init = ncclCommInitRankConfig(&m.comm, n, id, me, &config);
  m.call.set_comm(m.comm);
  m.call(init, "ncclCommInitRankConfig (the communicator set-up)");

  m.call(ncclMemAlloc(&m.region, region_bytes), "ncclMemAlloc of the symmetric region");
  TILEMOE_CUDA_CHECK(cudaMemset(m.region, 0, region_bytes));
  TILEMOE_CUDA_CHECK(cudaDeviceSynchronize());
  m.call(ncclCommWindowRegister(m.comm, m.region, region_bytes, &m.window, NCCL_WIN_COLL_SYMMETRIC),
         "ncclCommWindowRegister (symmetric)");
  ncclDevCommRequirements requirements;
  std::memset(&requirements, 0, sizeof requirements);  // LSA pointers only: no barriers, no GIN, never multimem
  m.call(ncclDevCommCreate(m.comm, &requirements, &m.dev_comm), "ncclDevCommCreate (needs CUDA P2P between all ranks and cuMem)");
  m.dev_comm_made = true;
  if (m.dev_comm.lsaSize != n) {
    // peers on other nodes: the same collective again, now with GIN signals (every rank sees
    // the same LSA size, so all take this branch). Compiled, untested here: no RDMA NIC.
    m.call(ncclDevCommDestroy(m.comm, &m.dev_comm), "ncclDevCommDestroy");
    m.dev_comm_made = false;
    requirements.ginSignalCount = static_cast<int>(kGinSignalCount);
    m.call(ncclDevCommCreate(m.comm, &requirements, &m.dev_comm), "ncclDevCommCreate with GIN (needs an RDMA NIC between the nodes)");
    m.dev_comm_made = true;
    if (m.dev_comm.ginContextCount == 0) {
      throw_bad_input("ranks on several nodes need NCCL's GIN, which this communicator does not have (no RDMA NIC?)");
    }
    TILEMOE_CUDA_CHECK(cudaMalloc(&m.dev_comm_copy, sizeof(ncclDevComm)));
    TILEMOE_CUDA_CHECK(cudaMemcpy(m.dev_comm_copy, &m.dev_comm, sizeof(ncclDevComm), cudaMemcpyHostToDevice));
  }

  std::byte** peers = nullptr;
  TILEMOE_CUDA_CHECK(cudaMalloc(&peers, sizeof(std::byte*) * kMaxRanks));
  resolve_peers_kernel<<<1, 32, 0, m.readback>>>(m.dev_comm, m.window, n, peers);
  TILEMOE_CUDA_CHECK_LAUNCH("resolve the peers' window pointers");
  std::byte* host_peers[kMaxRanks] = {};
  TILEMOE_CUDA_CHECK(cudaMemcpyAsync(host_peers, peers, sizeof(std::byte*) * n, cudaMemcpyDeviceToHost, m.readback));
  TILEMOE_CUDA_CHECK(cudaStreamSynchronize(m.readback));
  cudaFree(peers);
  m.view.rank = me;
  m.view.world = n;
  for (int p = 0; p < n; ++p) m.view.region[p] = p == me ? static_cast<std::byte*>(m.region) : host_peers[p];
  m.view.failure = reinterpret_cast<comm::WaitFailure*>(static_cast<std::byte*>(m.region) + kFailureRecordOffset);
  m.view.timeout_ns = static_cast<std::uint64_t>(options.timeout.count()) * 1'000'000ull;
  m.view.link_bytes_per_ns = 0.0;  // real links
  m.view.gin_comm = m.dev_comm_copy;  // null unless some peers are on other nodes
  m.view.window = m.window;
  rendezvous.barrier();  // every region is zeroed and registered before anybody writes into one
}

NcclWorld::~NcclWorld() = default;

RankTransport& NcclWorld::transport() { return *impl_; }

}  // namespace tilemoe::cuda
