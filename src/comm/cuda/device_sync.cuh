#pragma once
// Device-side synchronisation over a DeviceTransport: release/acquire flags at system scope
// (a peer GPU is outside device scope), bounded waits on a %globaltimer deadline, the abort
// word, and link pacing. Flags are 64-bit counters that only grow (never reset mid-protocol):
// a wait compares against an epoch-derived target, so runs and graph replays need no reset.
#include <cuda/atomic>

#include "comm/cuda/device_transport.hpp"

namespace tilemoe::cuda {

__device__ inline std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

template <typename T>
__device__ inline T* region_at(const DeviceTransport& t, int rank, std::size_t offset) {
  return reinterpret_cast<T*>(t.region[rank] + offset);
}

__device__ inline void store_release(std::uint64_t* flag, std::uint64_t value) {
  ::cuda::atomic_ref<std::uint64_t, ::cuda::thread_scope_system>(*flag).store(value, ::cuda::memory_order_release);
}

__device__ inline void add_release(std::uint64_t* flag, std::uint64_t value) {
  ::cuda::atomic_ref<std::uint64_t, ::cuda::thread_scope_system>(*flag).fetch_add(value, ::cuda::memory_order_release);
}

__device__ inline std::uint64_t load_acquire(const std::uint64_t* flag) {
  return ::cuda::atomic_ref<std::uint64_t, ::cuda::thread_scope_system>(*const_cast<std::uint64_t*>(flag))
      .load(::cuda::memory_order_acquire);
}

__device__ inline std::uint32_t* abort_word(const DeviceTransport& t, int rank) {
  return region_at<std::uint32_t>(t, rank, 0);
}

__device__ inline bool transport_failed(const DeviceTransport& t) {
  return ::cuda::atomic_ref<std::uint32_t, ::cuda::thread_scope_system>(*abort_word(t, t.rank)).load(::cuda::memory_order_relaxed) != 0 ||
         ::cuda::atomic_ref<std::uint32_t, ::cuda::thread_scope_device>(t.failure->state).load(::cuda::memory_order_relaxed) != 0;
}

// Records the failure (first one wins) and raises the abort word at every rank.
__device__ inline void record_failure(const DeviceTransport& t, comm::WaitState state, int peer, comm::WaitSubject subject,
                                      std::uint64_t expected, std::uint64_t seen, std::uint64_t waited_ns,
                                      std::uint64_t step) {
  if (atomicCAS(&t.failure->state, 0u, static_cast<std::uint32_t>(state)) == 0u) {
    t.failure->rank = t.rank;
    t.failure->peer = peer;
    t.failure->subject = static_cast<std::uint32_t>(subject);
    t.failure->expected = expected;
    t.failure->seen = seen;
    t.failure->waited_ns = waited_ns;
    t.failure->step = step;
    __threadfence();
  }
  for (int p = 0; p < t.world; ++p) {
    if (t.region[p] == nullptr) continue;  // a GIN peer: it runs into its own deadline
    ::cuda::atomic_ref<std::uint32_t, ::cuda::thread_scope_system>(*abort_word(t, p)).store(1u, ::cuda::memory_order_relaxed);
  }
}

// One thread polls `read()` (an acquiring load of a counter that only grows) until it is >=
// expected. False if the deadline passed (recorded as a timeout naming `peer`) or the step is
// failing already (recorded as aborted); the caller then skips its work and leaves the kernel.
// Callers extend the acquire to their CTA with a __syncthreads() after the wait.
template <typename Read>
__device__ inline bool bounded_wait(const DeviceTransport& t, Read read, std::uint64_t expected, int peer, comm::WaitSubject subject,
                                    std::uint64_t step) {
  const std::uint64_t start = global_timer_ns();
  std::uint32_t spins = 0;
  for (;;) {
    const std::uint64_t seen = read();
    if (seen >= expected) return true;
    if ((++spins & 63u) == 0) {
      const std::uint64_t now = global_timer_ns();
      if (transport_failed(t)) {
        record_failure(t, comm::WaitState::Aborted, peer, subject, expected, seen, now - start, step);
        return false;
      }
      if (now - start > t.timeout_ns) {
        record_failure(t, comm::WaitState::TimedOut, peer, subject, expected, seen, now - start, step);
        return false;
      }
      __nanosleep(64);
    }
  }
}

// A flag in some rank's region (system scope: the writer may be another GPU).
__device__ inline bool wait_at_least(const DeviceTransport& t, const std::uint64_t* flag, std::uint64_t expected, int peer,
                                     comm::WaitSubject subject, std::uint64_t step) {
  return bounded_wait(t, [flag] { return load_acquire(flag); }, expected, peer, subject, step);
}

// One thread: this rank's GEMM flag (a planned GEMM's tile count, reset every step) >= expected
// (GPU scope: the producer is on this GPU), bounded like every other wait.
__device__ inline bool wait_tile_flag(const DeviceTransport& t, const unsigned* flag, unsigned expected, std::uint64_t step) {
  ::cuda::atomic_ref<unsigned, ::cuda::thread_scope_device> ref(*const_cast<unsigned*>(flag));
  return bounded_wait(t, [&ref] { return static_cast<std::uint64_t>(ref.load(::cuda::memory_order_acquire)); }, expected, t.rank,
                      comm::WaitSubject::TileFlags, step);
}

// Link pacing for one CTA that owns `share` of its rank's outgoing link: after it has sent
// `bytes_sent` bytes since `start_ns`, it may not run ahead of the emulated link.
__device__ inline void pace_link(const DeviceTransport& t, std::uint64_t start_ns, double bytes_sent, double share) {
  if (t.link_bytes_per_ns <= 0.0) return;
  const double rate = t.link_bytes_per_ns * share;
  const auto due = start_ns + static_cast<std::uint64_t>(bytes_sent / rate);
  while (global_timer_ns() < due) __nanosleep(256);
}

}  // namespace tilemoe::cuda
