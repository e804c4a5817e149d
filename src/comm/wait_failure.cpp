#include "comm/wait_failure.hpp"

#include <cstdio>

namespace tilemoe::comm {

const char* wait_subject_name(WaitSubject subject) {
  switch (subject) {
    case WaitSubject::DispatchCounts: return "the dispatch counts";
    case WaitSubject::DispatchRows: return "the dispatched token rows";
    case WaitSubject::CombineRows: return "the returned expert outputs";
    case WaitSubject::Barrier: return "the barrier arrival";
    case WaitSubject::TileFlags: return "the GEMM tile ready flags";
  }
  return "an unknown flag";
}

std::string describe(const WaitFailure& f) {
  char text[320];
  const char* subject = wait_subject_name(static_cast<WaitSubject>(f.subject));
  const auto seconds = static_cast<double>(f.waited_ns) * 1e-9;
  if (static_cast<WaitState>(f.state) == WaitState::CapacityExceeded) {
    std::snprintf(text, sizeof text,
                  "step %llu sends %llu rows to rank %d, more than its receive capacity of %llu rows: raise "
                  "EpMoeLayerOptions::receive_rows (0 = the dropless worst case); nothing was sent",
                  static_cast<unsigned long long>(f.step), static_cast<unsigned long long>(f.seen), f.peer,
                  static_cast<unsigned long long>(f.expected));
  } else if (static_cast<WaitState>(f.state) == WaitState::PlanInvalid && f.peer < 0) {
    std::snprintf(text, sizeof text, "rank %d's plan of step %llu is incomplete (its table %llu lacked room): a compiler's bug",
                  f.rank, static_cast<unsigned long long>(f.step), static_cast<unsigned long long>(f.expected) - 1);
  } else if (static_cast<WaitState>(f.state) == WaitState::PlanInvalid) {
    std::snprintf(text, sizeof text,
                  "rank %d cannot run entry %llu of its plan of step %llu (toward rank %d): it names a buffer, row, "
                  "column or flag the exchange does not hold; a compiler's bug",
                  f.rank, static_cast<unsigned long long>(f.expected), static_cast<unsigned long long>(f.step), f.peer);
  } else if (static_cast<WaitState>(f.state) == WaitState::Aborted) {
    std::snprintf(text, sizeof text, "rank %d stopped waiting for %s of rank %d in step %llu because another rank had failed",
                  f.rank, subject, f.peer, static_cast<unsigned long long>(f.step));
  } else {
    std::snprintf(text, sizeof text,
                  "rank %d waited %.2f s for %s of rank %d in step %llu (flag at %llu, wanted >= %llu): rank %d "
                  "stalled, died or never sent",
                  f.rank, seconds, subject, f.peer, static_cast<unsigned long long>(f.step),
                  static_cast<unsigned long long>(f.seen), static_cast<unsigned long long>(f.expected), f.peer);
  }
  return text;
}

void throw_if_failed(const std::vector<WaitFailure>& failures) {
  std::string timed_out;
  int aborted = 0;
  for (const WaitFailure& f : failures) {
    if (static_cast<WaitState>(f.state) == WaitState::CapacityExceeded) throw_bad_input(describe(f));
  }
  for (const WaitFailure& f : failures) {  // the root cause of the peers' timeouts
    if (static_cast<WaitState>(f.state) == WaitState::PlanInvalid) throw_internal(describe(f));
  }
  const WaitFailure* first_aborted = nullptr;
  for (const WaitFailure& f : failures) {
    const auto state = static_cast<WaitState>(f.state);
    if (state == WaitState::TimedOut) {
      timed_out += (timed_out.empty() ? "" : "; ") + describe(f);
    } else if (state == WaitState::Aborted) {
      if (!first_aborted) first_aborted = &f;
      ++aborted;
    } else if (state != WaitState::Clear && state != WaitState::CapacityExceeded && state != WaitState::PlanInvalid) {
      throw_internal("a device wait record has the unknown state " + std::to_string(f.state));
    }
  }
  if (!timed_out.empty()) {
    if (aborted > 0) timed_out += " (" + std::to_string(aborted) + " other rank(s) stopped because of it)";
    throw Error(ErrorKind::Timeout, timed_out);
  }
  if (first_aborted) throw_internal(describe(*first_aborted) + ", but no rank of this process reported the cause");
}

}  // namespace tilemoe::comm
