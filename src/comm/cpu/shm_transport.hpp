#pragma once
// The CPU transport: ranks are threads of one process and share memory. It offers exactly
// the primitives the GPU transports offer the kernels: symmetric buffers with peer
// addressing, put, per-slot flags with release/acquire, counters, barriers, and bounded
// waits that turn a stalled peer into an error naming who waited for what from whom.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tilemoe::cpu {

// The longest wait bound a transport accepts: now() + timeout stays far from the clock's
// overflow, and a wait of more than a day is no bound.
constexpr std::chrono::hours kMaxWaitTimeout{24};

class ShmTransport {
 public:
  using Describe = std::function<std::string()>;

  ShmTransport(int world_size, std::chrono::nanoseconds timeout);
  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

  int world_size() const { return world_size_; }
  std::chrono::nanoseconds timeout() const { return timeout_; }

  // A symmetric buffer: `bytes` on every rank; returns its handle.
  int alloc_symmetric(std::size_t bytes);
  std::byte* peer_ptr(int handle, int rank);
  std::size_t buffer_bytes(int handle) const { return buffers_.at(static_cast<std::size_t>(handle)).bytes; }

  // Copies into a peer's buffer. Visible to the peer once a later signal() is acquired.
  // With a link rate set, a put to another rank also takes bytes / rate of wall time on the
  // source rank's outgoing link, which its communication workers share (link emulation).
  // That time is a wait like any other: a put that would occupy the link for longer than
  // timeout() (this one plus the sends queued before it) is a bad-input error naming the rate,
  // and the sleep ends early with the abort error when another worker fails.
  void put(int src_rank, int dest_rank, int handle, std::size_t offset, const void* src, std::size_t bytes);
  void set_link_rate(double bytes_per_second) { link_bytes_per_second_ = bytes_per_second; }

  // Per-rank flags, all starting at 0.
  void resize_flags(int rank, std::size_t count);
  void reset_flags();
  void signal(int dest_rank, std::uint32_t flag);  // +1, release
  std::uint32_t flag_value(int rank, std::uint32_t flag) const;
  // Waits (acquire) until the flag of `rank` reaches `expected`. Throws a Timeout error
  // naming rank, peer and flag after timeout(); throws an Internal "aborted" error if another
  // worker failed meanwhile (see abort()). `what` describes the wait for the message.
  void wait(int rank, std::uint32_t flag, std::uint32_t expected, int from_rank, const Describe& what);

  // All ranks meet; bounded like every wait.
  void barrier(int rank);

  // Sleeps until `until` in short slices; throws the abort error (is_abort_error) as soon as
  // another worker has failed, so that no sleeper holds up a failing step.
  void sleep_until(std::chrono::steady_clock::time_point until) const;

  // Makes every current and later wait fail fast; the step is failing.
  void abort();
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  void clear_abort() { aborted_.store(false, std::memory_order_release); }

 private:
  struct Buffer {
    std::size_t bytes = 0;
    std::vector<std::unique_ptr<std::byte[]>> per_rank;
  };
  int world_size_;
  std::chrono::nanoseconds timeout_;
  std::vector<Buffer> buffers_;
  std::vector<std::unique_ptr<std::atomic<std::uint32_t>[]>> flags_;
  std::vector<std::size_t> flag_counts_;
  std::atomic<bool> aborted_{false};
  double link_bytes_per_second_ = 0.0;  // 0 = unlimited
  std::mutex link_mutex_;
  std::vector<std::chrono::steady_clock::time_point> link_free_at_;
  std::mutex barrier_mutex_;
  std::uint64_t barrier_generation_ = 0;
  int barrier_arrived_ = 0;
  std::atomic<std::uint64_t> barrier_generation_seen_{0};
};

// The error a wait raises when another worker has already failed: not the root cause.
bool is_abort_error(const std::exception& error);

}  // namespace tilemoe::cpu
