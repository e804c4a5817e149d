#include "comm/timed_barrier.hpp"

#include "tilemoe/error.hpp"

namespace tilemoe::comm {

TimedBarrier::TimedBarrier(int participants, std::chrono::milliseconds timeout)
    : participants_(participants), timeout_(timeout), arrived_at_(static_cast<std::size_t>(participants), ~0ull) {
  if (participants < 1) throw_bad_input("a barrier needs at least one participant");
}

void TimedBarrier::arrive_and_wait(int who, const std::string& what) {
  if (who < 0 || who >= participants_) throw_internal("barrier: participant " + std::to_string(who) + " out of range");
  std::unique_lock lock(mutex_);
  if (!broken_.empty()) throw Error(broken_kind_, "rank " + std::to_string(who) + " cannot meet at " + what + ": " + broken_);
  const std::uint64_t generation = generation_;
  arrived_at_[static_cast<std::size_t>(who)] = generation;
  if (++arrived_ == participants_) {
    arrived_ = 0;
    ++generation_;
    changed_.notify_all();
    return;
  }
  if (!changed_.wait_for(lock, timeout_, [&] { return generation_ != generation || !broken_.empty(); })) {
    std::string missing;
    for (int p = 0; p < participants_; ++p) {
      if (arrived_at_[static_cast<std::size_t>(p)] != generation) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
    }
    broken_ = "rank " + std::to_string(who) + " waited " + std::to_string(timeout_.count()) + " ms at " + what +
              " for rank(s) " + missing + ", which never arrived";
    changed_.notify_all();
    throw Error(ErrorKind::Timeout, broken_);
  }
  if (generation_ == generation) {  // woken because another participant timed out
    throw Error(broken_kind_, "rank " + std::to_string(who) + " left " + what + ": " + broken_);
  }
}

void TimedBarrier::abandon(int who, const std::string& reason, ErrorKind kind) {
  std::lock_guard lock(mutex_);
  if (broken_.empty()) {
    broken_ = "rank " + std::to_string(who) + " failed: " + reason;
    broken_kind_ = kind;
  }
  changed_.notify_all();
}

}  // namespace tilemoe::comm
