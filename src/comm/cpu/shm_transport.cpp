#include "shm_transport.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "tilemoe/error.hpp"

namespace tilemoe::cpu {

namespace {

constexpr const char* kAborted = "wait abandoned: another worker of this step failed first";

// Polls with a short spin, then yields, then sleeps: ranks x workers threads share few
// cores, so a waiter must give its core to the worker it waits for.
class Backoff {
 public:
  void pause() {
    if (round_ < 64) {
      ++round_;
    } else if (round_ < 128) {
      ++round_;
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
      sleep_us_ = std::min(sleep_us_ * 2, 500);
    }
  }

 private:
  int round_ = 0;
  int sleep_us_ = 10;
};

}  // namespace

bool is_abort_error(const std::exception& error) { return std::strcmp(error.what(), kAborted) == 0; }

ShmTransport::ShmTransport(int world_size, std::chrono::nanoseconds timeout)
    : world_size_(world_size), timeout_(timeout), flags_(static_cast<std::size_t>(world_size)),
      flag_counts_(static_cast<std::size_t>(world_size), 0),
      link_free_at_(static_cast<std::size_t>(world_size)) {
  if (world_size < 1) throw_bad_input("a transport needs at least one rank");
  if (timeout.count() <= 0) throw_bad_input("the wait timeout must be positive");
  // now() + timeout must not overflow the clock; a bound of days is no bound anyway
  if (timeout > kMaxWaitTimeout) {
    throw_bad_input("the wait timeout of " + std::to_string(std::chrono::duration_cast<std::chrono::hours>(timeout).count()) +
                    " h is more than a day: use a shorter one");
  }
}

int ShmTransport::alloc_symmetric(std::size_t bytes) {
  Buffer buffer;
  buffer.bytes = bytes;
  for (int r = 0; r < world_size_; ++r) buffer.per_rank.push_back(std::make_unique<std::byte[]>(bytes > 0 ? bytes : 1));
  buffers_.push_back(std::move(buffer));
  return static_cast<int>(buffers_.size() - 1);
}

std::byte* ShmTransport::peer_ptr(int handle, int rank) {
  return buffers_.at(static_cast<std::size_t>(handle)).per_rank.at(static_cast<std::size_t>(rank)).get();
}

void ShmTransport::put(int src_rank, int dest_rank, int handle, std::size_t offset, const void* src, std::size_t bytes) {
  const Buffer& buffer = buffers_.at(static_cast<std::size_t>(handle));
  if (offset > buffer.bytes || bytes > buffer.bytes - offset) {
    throw_internal("put of " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                   " overruns a symmetric buffer of " + std::to_string(buffer.bytes) + " bytes on rank " +
                   std::to_string(dest_rank));
  }
  std::memcpy(buffer.per_rank.at(static_cast<std::size_t>(dest_rank)).get() + offset, src, bytes);
  if (link_bytes_per_second_ <= 0.0 || src_rank == dest_rank) return;
  // In double seconds until it is known to fit the timeout: bytes / a tiny rate overflows any
  // integer duration.
  const double seconds = static_cast<double>(bytes) / link_bytes_per_second_;
  std::chrono::steady_clock::time_point done;
  {
    std::lock_guard<std::mutex> lock(link_mutex_);
    auto& free_at = link_free_at_.at(static_cast<std::size_t>(src_rank));
    const auto now = std::chrono::steady_clock::now();
    const auto start = std::max(free_at, now);
    const double busy = std::chrono::duration<double>(start - now).count() + seconds;
    const double bound = std::chrono::duration<double>(timeout_).count();
    if (!(busy <= bound)) {
      char text[256];
      std::snprintf(text, sizeof text,
                    "rank %d's emulated link (%.3g MB/s) would be busy for %.3g ms sending %zu bytes to rank %d "
                    "(with the sends queued before them), longer than the wait bound of %.0f ms: raise --link-mbps "
                    "(0 = unlimited) or --timeout-ms",
                    src_rank, link_bytes_per_second_ / 1e6, busy * 1e3, bytes, dest_rank, bound * 1e3);
      throw_bad_input(text);
    }
    free_at = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
    done = free_at;
  }
  sleep_until(done);
}

void ShmTransport::sleep_until(std::chrono::steady_clock::time_point until) const {
  // short enough that a failing step ends promptly, long enough to cost nothing
  constexpr auto kSlice = std::chrono::milliseconds(5);
  for (;;) {
    if (aborted()) throw Error(ErrorKind::Internal, kAborted);
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) return;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(until - now, kSlice));
  }
}

void ShmTransport::resize_flags(int rank, std::size_t count) {
  auto& slot = flags_.at(static_cast<std::size_t>(rank));
  slot = std::make_unique<std::atomic<std::uint32_t>[]>(count > 0 ? count : 1);
  flag_counts_[static_cast<std::size_t>(rank)] = count;
  for (std::size_t i = 0; i < count; ++i) slot[i].store(0, std::memory_order_relaxed);
}

void ShmTransport::reset_flags() {
  for (int r = 0; r < world_size_; ++r) {
    for (std::size_t i = 0; i < flag_counts_[static_cast<std::size_t>(r)]; ++i) {
      flags_[static_cast<std::size_t>(r)][i].store(0, std::memory_order_relaxed);
    }
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void ShmTransport::signal(int dest_rank, std::uint32_t flag) {
  if (flag >= flag_counts_.at(static_cast<std::size_t>(dest_rank))) {
    throw_internal("signal of flag " + std::to_string(flag) + " on rank " + std::to_string(dest_rank) + " which has " +
                   std::to_string(flag_counts_[static_cast<std::size_t>(dest_rank)]) + " flags");
  }
  flags_[static_cast<std::size_t>(dest_rank)][flag].fetch_add(1, std::memory_order_release);
}

std::uint32_t ShmTransport::flag_value(int rank, std::uint32_t flag) const {
  return flags_.at(static_cast<std::size_t>(rank))[flag].load(std::memory_order_acquire);
}

void ShmTransport::wait(int rank, std::uint32_t flag, std::uint32_t expected, int from_rank, const Describe& what) {
  if (flag >= flag_counts_.at(static_cast<std::size_t>(rank))) {
    throw_internal("wait on flag " + std::to_string(flag) + " of rank " + std::to_string(rank) + " which has " +
                   std::to_string(flag_counts_[static_cast<std::size_t>(rank)]) + " flags");
  }
  const auto& cell = flags_[static_cast<std::size_t>(rank)][flag];
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  Backoff backoff;
  while (cell.load(std::memory_order_acquire) < expected) {
    if (aborted()) throw Error(ErrorKind::Internal, kAborted);
    if (std::chrono::steady_clock::now() >= deadline) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout_).count();
      const std::string whom = from_rank == rank ? "its own work (no peer is involved: raise --timeout-ms if the step is just slow)"
                                                 : "rank " + std::to_string(from_rank);
      throw Error(ErrorKind::Timeout,
                  "rank " + std::to_string(rank) + " timed out after " + std::to_string(ms) + " ms waiting for " + whom + ": flag " + std::to_string(flag) + " reached " +
                      std::to_string(cell.load(std::memory_order_acquire)) + " of " + std::to_string(expected) +
                      " signals" + (what ? " (" + what() + ")" : std::string()));
    }
    backoff.pause();
  }
}

void ShmTransport::barrier(int rank) {
  std::uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(barrier_mutex_);
    generation = barrier_generation_;
    if (++barrier_arrived_ == world_size_) {
      barrier_arrived_ = 0;
      ++barrier_generation_;
      barrier_generation_seen_.store(barrier_generation_, std::memory_order_release);
      return;
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  Backoff backoff;
  while (barrier_generation_seen_.load(std::memory_order_acquire) == generation) {
    if (aborted()) throw Error(ErrorKind::Internal, kAborted);
    if (std::chrono::steady_clock::now() >= deadline) {
      throw Error(ErrorKind::Timeout, "rank " + std::to_string(rank) + " timed out in a barrier: not every rank arrived");
    }
    backoff.pause();
  }
}

void ShmTransport::abort() { aborted_.store(true, std::memory_order_release); }

}  // namespace tilemoe::cpu
