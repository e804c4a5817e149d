#pragma once
// A reusable barrier of a fixed number of threads whose wait is bounded: a participant that
// does not arrive in time turns into a Timeout error naming the ones missing, never a hang.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "tilemoe/error.hpp"

namespace tilemoe::comm {

class TimedBarrier {
 public:
  TimedBarrier(int participants, std::chrono::milliseconds timeout);
  // `who` arrives and waits for the others of this generation. `what` names the meeting.
  // After a timeout the barrier is broken: every later wait fails at once (the world it
  // synchronised has lost a member), instead of each waiting out its own deadline.
  void arrive_and_wait(int who, const std::string& what);
  // `who` will never arrive again (it failed with an error of `kind`): the others stop waiting
  // for it now, with an error of the same kind (a peer's bad input or exhausted memory is the
  // whole world's, not a timeout) that names `who` and `reason`.
  void abandon(int who, const std::string& reason, ErrorKind kind = ErrorKind::Internal);

 private:
  int participants_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::uint64_t generation_ = 0;
  std::vector<std::uint64_t> arrived_at_;  // per participant: the generation it last arrived in
  int arrived_ = 0;
  std::string broken_;  // the first timeout's or abandonment's message, once broken
  ErrorKind broken_kind_ = ErrorKind::Timeout;  // the kind of error every later wait throws
};

}  // namespace tilemoe::comm
