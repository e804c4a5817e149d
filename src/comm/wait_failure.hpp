#pragma once
// What a bounded wait on the device leaves behind when it gives up, and the host-side message
// made from it. Plain C++ so that the CPU tests check the messages and CUDA code shares the
// record's layout.
#include <cstdint>
#include <string>
#include <vector>

#include "tilemoe/error.hpp"

namespace tilemoe::comm {

// What a device wait was waiting for. Stable numbers: they are stored in device memory.
enum class WaitSubject : std::uint32_t {
  DispatchCounts = 1,  // a peer's per-expert row counts for this step
  DispatchRows = 2,    // a peer's token rows for my experts
  CombineRows = 3,     // a peer's expert outputs for my tokens
  Barrier = 4,         // a peer's arrival at a barrier
  TileFlags = 5,       // this rank's own GEMM tiles (tile-signal overlap): peer is the rank itself
};
const char* wait_subject_name(WaitSubject subject);

enum class WaitState : std::uint32_t {
  Clear = 0,
  TimedOut = 1,  // this rank waited past the deadline: the root cause names the peer
  Aborted = 2,   // this rank stopped waiting because another rank had already failed
  // not a wait: the step's routing sends `seen` rows to rank `peer`, more than its receive
  // capacity `expected`; every rank finds it from the same counts, nothing is sent
  CapacityExceeded = 3,
  // not a wait: this rank's plan of the step cannot run on the exchange (a compiler's bug: an
  // overflowed table, a buffer or flag the exchange does not hold); `expected` names the
  // segment (or, past the segments, the wait) and `peer` its destination
  PlanInvalid = 4,
};

// One per rank, in that rank's device memory; the first failing wait of a kernel writes it
// (state first, by compare-and-swap, so a record is never a mix of two failures).
struct WaitFailure {
  std::uint32_t state = 0;     // WaitState
  std::int32_t rank = -1;      // who waited
  std::int32_t peer = -1;      // for whom
  std::uint32_t subject = 0;   // WaitSubject
  std::uint64_t expected = 0;  // the flag value waited for
  std::uint64_t seen = 0;      // the value it had at the deadline
  std::uint64_t waited_ns = 0;
  std::uint64_t step = 0;      // the step (epoch) of the wait
};
static_assert(sizeof(WaitFailure) == 48);

// "rank 0 waited 2.00 s for the dispatch counts of rank 3 in step 5 (flag at 4, wanted >= 5)".
std::string describe(const WaitFailure& failure);

// Throws if any record is not clear: a bad-input error for an exceeded receive capacity, an
// Internal one for a plan the exchange cannot run, a Timeout error built from the timed-out
// records (the root causes; aborted ranks are summarised), or an Internal one if all were aborted.
void throw_if_failed(const std::vector<WaitFailure>& failures);

}  // namespace tilemoe::comm
