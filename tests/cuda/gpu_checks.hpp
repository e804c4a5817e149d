#pragma once
// What every GPU test program shares (tests/cuda): its checks and verdict.
//  - expect(): one check, counted; a line for each failure, and for each pass unless the program
//    asked for failures only (its checks number in the hundreds). Thread-safe: the virtual-rank
//    tests check from the ranks' threads.
//  - verdict(): the last line ("PASSED: 0 of 412 checks failed") and the exit code.
// The cases and the oracle they are held to are tests/cases' (shared with the benchmarks).
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

namespace tilemoe::gpu_checks {

struct Tally {
  std::mutex mutex;
  int checks = 0;
  int failures = 0;
  bool print_passes = true;
};

inline Tally& tally() {
  static Tally t;
  return t;
}

inline void print_failures_only() { tally().print_passes = false; }

inline void expect(bool ok, const std::string& what) {
  Tally& t = tally();
  std::lock_guard lock(t.mutex);
  ++t.checks;
  if (!ok) ++t.failures;
  if (!ok || t.print_passes) std::printf("  [%s] %s\n", ok ? "ok" : "FAIL", what.c_str());
}

// A failure found outside a check (an unexpected exception): counted, and said.
inline void fail(const std::string& what) { expect(false, what); }

inline int failures() {
  Tally& t = tally();
  std::lock_guard lock(t.mutex);
  return t.failures;
}

inline int verdict() {
  Tally& t = tally();
  std::lock_guard lock(t.mutex);
  std::printf("%s: %d of %d checks failed\n", t.failures ? "FAILED" : "PASSED", t.failures, t.checks);
  return t.failures ? 1 : 0;
}

}  // namespace tilemoe::gpu_checks
