#include "tilemoe/cuda/virtual_world.hpp"

#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "comm/cuda/bounded_sync.hpp"
#include "comm/cuda/device_transport.hpp"
#include "comm/cuda/sm_partitions.hpp"
#include "comm/timed_barrier.hpp"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/cuda/module_loading.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

// What a rank publishes for the host-API collectives: the event after which its sources are
// ready, the one after which it has finished its copies, and where peers put its data.
struct Published {
  cudaEvent_t ready = nullptr;
  cudaEvent_t done = nullptr;
  const std::byte* source = nullptr;  // all_gather: this rank's values
  std::byte* receive = nullptr;       // all_to_all: this rank's receive buffer
  std::vector<std::size_t> receive_offset, receive_bytes;
};

// What the ranks of one virtual world share.
struct SharedWorld {
  int ranks = 0;
  std::size_t region_bytes = 0;
  int device = 0;
  VirtualWorldOptions options;
  std::byte* base = nullptr;
  comm::TimedBarrier barrier;
  std::vector<Published> published;
  std::unique_ptr<SmPartitions> partitions;  // when each rank has its own SMs
  int device_sms = 0;

  SharedWorld(int n, std::chrono::milliseconds timeout) : barrier(n, timeout), published(static_cast<std::size_t>(n)) {}
};

// One virtual rank: its view of the world and its host-API collectives. The collectives are a
// two-barrier exchange among the ranks' threads: publish (event + pointers), meet, enqueue the
// copies on the own stream after the peers' ready events, record done, meet, and make the own
// stream wait for the peers' done events (so nobody reuses a buffer a peer still reads).
class VirtualRank final : public RankTransport, public HostExchange {
 public:
  VirtualRank(SharedWorld& world, int rank) : world_(world), rank_(rank) {
    view_.rank = rank;
    view_.world = world.ranks;
    for (int p = 0; p < world.ranks; ++p) view_.region[p] = world.base + static_cast<std::size_t>(p) * world.region_bytes;
    view_.failure = reinterpret_cast<comm::WaitFailure*>(view_.region[rank] + kFailureRecordOffset);
    view_.timeout_ns = static_cast<std::uint64_t>(world.options.timeout.count()) * 1'000'000ull;
    view_.link_bytes_per_ns = world.options.link_gbps;  // GB/s is bytes per ns
    Published& mine = world.published[static_cast<std::size_t>(rank)];
    TILEMOE_CUDA_CHECK(cudaEventCreateWithFlags(&mine.ready, cudaEventDisableTiming));
    TILEMOE_CUDA_CHECK(cudaEventCreateWithFlags(&mine.done, cudaEventDisableTiming));
    // the rank's streams (RankStream), on its SM partition if it has one; the world makes all
    // ranks' streams in one batch (its constructor, one thread) so they take distinct queues
    if (world.partitions) world.partitions->enter(rank);
    int lowest = 0, highest = 0;
    TILEMOE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
    TILEMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&streams_[0], cudaStreamNonBlocking));
    TILEMOE_CUDA_CHECK(cudaStreamCreateWithPriority(&streams_[1], cudaStreamNonBlocking, highest));
    TILEMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&streams_[2], cudaStreamNonBlocking));
  }
  ~VirtualRank() override {
    Published& mine = world_.published[static_cast<std::size_t>(rank_)];
    cudaEventDestroy(mine.ready);
    cudaEventDestroy(mine.done);
    for (cudaStream_t s : streams_) {
      if (s) cudaStreamDestroy(s);
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_.ranks; }
  int device() const override { return world_.device; }
  std::size_t region_bytes() const override { return world_.region_bytes; }
  int ranks_per_device() const override { return world_.ranks; }
  int sm_count() const override { return world_.partitions ? world_.partitions->sms(rank_) : world_.device_sms; }
  int ranks_sharing_sms() const override { return world_.partitions ? 1 : world_.ranks; }
  double link_bytes_per_s() const override { return world_.options.link_gbps * 1e9; }
  void bind_thread() override {
    if (world_.partitions) {
      world_.partitions->enter(rank_);
    } else {
      TILEMOE_CUDA_CHECK(cudaSetDevice(world_.device));
    }
  }
  cudaStream_t stream(RankStream which) const override { return streams_[static_cast<int>(which)]; }
  const DeviceTransport& device_view() const override { return view_; }
  HostExchange& host_exchange() override { return *this; }

  void host_barrier() override { world_.barrier.arrive_and_wait(rank_, "a host barrier of the virtual world"); }

  void synchronize(cudaStream_t stream, const char* what, int waits) override {
    const auto bound = waits * world_.options.timeout + std::chrono::milliseconds(1000);
    if (!wait_for_stream(stream, bound)) {
      throw Error(ErrorKind::Timeout, "rank " + std::to_string(rank_) + " waited " + std::to_string(bound.count()) +
                                          " ms for " + what + ": a peer rank stalled");
    }
  }

  void throw_if_failed() const override {
    std::vector<comm::WaitFailure> records(static_cast<std::size_t>(world_.ranks));
    // one copy per rank: a 2D copy with the region as pitch would exceed the maximum pitch
    // (2 GiB) at large layers. On the set-up stream: the legacy stream would wait for the
    // other ranks' kernels, which may be waiting for this rank
    cudaStream_t readback = stream(RankStream::Setup);
    for (int p = 0; p < world_.ranks; ++p) {
      TILEMOE_CUDA_CHECK(cudaMemcpyAsync(&records[static_cast<std::size_t>(p)], view_.region[p] + kFailureRecordOffset,
                                         sizeof(comm::WaitFailure), cudaMemcpyDeviceToHost, readback));
    }
    TILEMOE_CUDA_CHECK(cudaStreamSynchronize(readback));
    comm::throw_if_failed(records);
  }

  void all_gather(cudaStream_t stream, const int* values, int count, int* gathered) override {
    Published& mine = mine_published();
    mine.source = reinterpret_cast<const std::byte*>(values);
    exchange(stream, "an all-gather", [&] {
      for (int q = 0; q < world_.ranks; ++q) {
        const Published& peer = world_.published[static_cast<std::size_t>(q)];
        if (q != rank_) TILEMOE_CUDA_CHECK(cudaStreamWaitEvent(stream, peer.ready, 0));
        TILEMOE_CUDA_CHECK(cudaMemcpyAsync(gathered + static_cast<std::size_t>(q) * count, peer.source,
                                           static_cast<std::size_t>(count) * sizeof(int), cudaMemcpyDeviceToDevice, stream));
      }
    });
  }

  void all_to_all(cudaStream_t stream, const void* send, const std::vector<std::size_t>& send_offset,
                  const std::vector<std::size_t>& send_bytes, void* recv, const std::vector<std::size_t>& recv_offset,
                  const std::vector<std::size_t>& recv_bytes) override {
    const auto n = static_cast<std::size_t>(world_.ranks);
    if (send_offset.size() != n || send_bytes.size() != n || recv_offset.size() != n || recv_bytes.size() != n) {
      throw_internal("all_to_all: one offset and size per rank expected");
    }
    Published& mine = mine_published();
    mine.receive = static_cast<std::byte*>(recv);
    mine.receive_offset = recv_offset;
    mine.receive_bytes = recv_bytes;
    const auto* source = static_cast<const std::byte*>(send);
    exchange(stream, "an all-to-all", [&] {
      // the push model of the device path: my rows go straight into each peer's buffer
      for (int k = 0; k < world_.ranks; ++k) {
        const int p = (rank_ + 1 + k) % world_.ranks;  // the same peer order as the kernels
        const Published& peer = world_.published[static_cast<std::size_t>(p)];
        const auto me = static_cast<std::size_t>(rank_);
        if (peer.receive_bytes[me] != send_bytes[static_cast<std::size_t>(p)]) {
          throw_internal("all_to_all: rank " + std::to_string(rank_) + " sends " +
                         std::to_string(send_bytes[static_cast<std::size_t>(p)]) + " bytes to rank " + std::to_string(p) +
                         ", which expects " + std::to_string(peer.receive_bytes[me]));
        }
        if (send_bytes[static_cast<std::size_t>(p)] == 0) continue;
        if (p != rank_) TILEMOE_CUDA_CHECK(cudaStreamWaitEvent(stream, peer.ready, 0));
        TILEMOE_CUDA_CHECK(cudaMemcpyAsync(peer.receive + peer.receive_offset[me], source + send_offset[static_cast<std::size_t>(p)],
                                           send_bytes[static_cast<std::size_t>(p)], cudaMemcpyDeviceToDevice, stream));
      }
    });
  }

 private:
  Published& mine_published() { return world_.published[static_cast<std::size_t>(rank_)]; }

  template <typename Copies>
  void exchange(cudaStream_t stream, const char* what, Copies&& copies) {
    Published& mine = mine_published();
    try {
      TILEMOE_CUDA_CHECK(cudaEventRecord(mine.ready, stream));
      world_.barrier.arrive_and_wait(rank_, std::string(what) + " (publishing buffers)");
      copies();
      TILEMOE_CUDA_CHECK(cudaEventRecord(mine.done, stream));
      world_.barrier.arrive_and_wait(rank_, std::string(what) + " (copies enqueued)");
      for (int q = 0; q < world_.ranks; ++q) {
        if (q != rank_) TILEMOE_CUDA_CHECK(cudaStreamWaitEvent(stream, world_.published[static_cast<std::size_t>(q)].done, 0));
      }
    } catch (const Error& e) {
      world_.barrier.abandon(rank_, e.what(), e.kind());  // the peers must not wait out the timeout for me
      throw;
    }
  }

  SharedWorld& world_;
  int rank_;
  DeviceTransport view_;
  cudaStream_t streams_[3] = {};  // by RankStream
};

}  // namespace

struct VirtualWorld::Impl : SharedWorld {
  using SharedWorld::SharedWorld;
  std::vector<std::unique_ptr<VirtualRank>> handles;
};

VirtualWorld::VirtualWorld(int ranks, std::size_t region_bytes, int device, VirtualWorldOptions options) {
  if (ranks < 1 || ranks > kMaxRanks) {
    throw_bad_input("virtual ranks: 1 to " + std::to_string(kMaxRanks) + " ranks, not " + std::to_string(ranks));
  }
  if (region_bytes < kTransportHeaderBytes || region_bytes % 256 != 0) {
    throw_bad_input("virtual ranks: a region of " + std::to_string(region_bytes) + " bytes is not a multiple of 256 bytes above the header");
  }
  if (options.timeout.count() <= 0) throw_bad_input("virtual ranks: the timeout must be positive");
  if (options.link_gbps < 0.0) throw_bad_input("virtual ranks: the link bandwidth must not be negative");
  if (options.sms_per_rank < 0) throw_bad_input("virtual ranks: SMs per rank must not be negative (0 = share the GPU)");
  impl_ = std::make_unique<Impl>(ranks, options.timeout);
  Impl& m = *impl_;
  m.ranks = ranks;
  m.region_bytes = region_bytes;
  m.device = device;
  m.options = options;
  TILEMOE_CUDA_CHECK(cudaSetDevice(device));
  // a world of one waits for no peer (the one-GPU layer is one), so lazy loading is safe there
  if (ranks > 1 && lazy_module_loading()) {
    throw_bad_input("virtual ranks need CUDA_MODULE_LOADING=EAGER in the environment (before CUDA starts): with lazy loading a "
                    "kernel's first launch can wait for the peers' kernels that wait for it");
  }
  TILEMOE_CUDA_CHECK(cudaDeviceGetAttribute(&m.device_sms, cudaDevAttrMultiProcessorCount, device));
  if (options.sms_per_rank > 0) m.partitions = std::make_unique<SmPartitions>(device, ranks, options.sms_per_rank);
  const std::size_t total = region_bytes * static_cast<std::size_t>(ranks);
  TILEMOE_CUDA_CHECK(cudaMalloc(&m.base, total));
  try {
    TILEMOE_CUDA_CHECK(cudaMemset(m.base, 0, total));  // flags start at 0, failure records clear
    TILEMOE_CUDA_CHECK(cudaDeviceSynchronize());
    {
      // the ranks' streams in one batch: no other thread of this process may make streams
      // between them (RankStream says why)
      static std::mutex stream_batches;
      std::lock_guard batch(stream_batches);
      for (int r = 0; r < ranks; ++r) m.handles.push_back(std::make_unique<VirtualRank>(m, r));
    }
    TILEMOE_CUDA_CHECK(cudaSetDevice(device));  // out of the last rank's partition
  } catch (...) {
    m.handles.clear();
    cudaFree(m.base);
    throw;
  }
}

VirtualWorld::~VirtualWorld() {
  if (!impl_) return;
  impl_->handles.clear();
  cudaFree(impl_->base);
}

int VirtualWorld::size() const { return impl_->ranks; }

RankTransport& VirtualWorld::rank(int r) {
  if (r < 0 || r >= impl_->ranks) throw_bad_input("virtual rank " + std::to_string(r) + " of " + std::to_string(impl_->ranks));
  return *impl_->handles[static_cast<std::size_t>(r)];
}

std::vector<std::exception_ptr> VirtualWorld::run_ranks(const std::function<void(RankTransport&)>& body) {
  Impl& m = *impl_;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(m.ranks));
  std::vector<std::jthread> threads;
  threads.reserve(static_cast<std::size_t>(m.ranks));
  for (int r = 0; r < m.ranks; ++r) {
    try {
      threads.emplace_back([&, r] {
        try {
          body(*m.handles[static_cast<std::size_t>(r)]);
        } catch (...) {
          errors[static_cast<std::size_t>(r)] = std::current_exception();
          const ErrorReport report = report_of(errors[static_cast<std::size_t>(r)]);
          m.barrier.abandon(r, report.message, report.kind);
        }
      });
    } catch (const std::system_error& e) {
      // this rank and the ones after it never start: the started ones must not wait for them
      for (int q = r; q < m.ranks; ++q) m.barrier.abandon(q, std::string("its thread could not be started: ") + e.what());
      threads.clear();  // joins the started ones
      throw;
    }
  }
  threads.clear();  // joins
  return errors;
}

}  // namespace tilemoe::cuda
