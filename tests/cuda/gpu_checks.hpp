#pragma once
// What every GPU test program shares (tests/cuda): its checks and verdict, and the oracle.
//  - expect(): one check, counted; a line for each failure, and for each pass unless the program
//    asked for failures only (its checks number in the hundreds). Thread-safe: the virtual-rank
//    tests check from the ranks' threads.
//  - verdict(): the last line ("PASSED: 0 of 412 checks failed") and the exit code.
//  - oracle_errors(): a GPU step's outputs against the CPU executor running a plan of the same
//    routing and against the fp64 reference (no intermediate rounding), the tolerance of bf16.
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "tilemoe/cpu_executor.hpp"
#include "tilemoe/reference.hpp"

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

// Relative Frobenius errors of bf16 steps stay near 3e-3 against fp64 (storage rounding); 1e-2
// leaves room for the GPU's other accumulation order, and catches any wrong row or weight.
constexpr double kBf16Tolerance = 1e-2;

struct OracleErrors {
  ErrorStats vs_cpu;       // the GPU against the CPU executor running the plans
  ErrorStats vs_fp64;      // the GPU against fp64
  ErrorStats cpu_vs_fp64;  // the CPU executor against fp64, for scale
  bool within_tolerance() const {
    return vs_fp64.finite && vs_cpu.finite && vs_fp64.relative_frobenius < kBf16Tolerance &&
           vs_cpu.relative_frobenius < kBf16Tolerance;
  }
  std::string describe() const {
    char text[200];
    std::snprintf(text, sizeof text, "rel. Frobenius error vs fp64 %.2e (CPU executor: %.2e), vs the CPU executor %.2e",
                  vs_fp64.relative_frobenius, cpu_vs_fp64.relative_frobenius, vs_cpu.relative_frobenius);
    return text;
  }
};

inline OracleErrors oracle_errors(const EpWorld& world, const std::vector<Matrix>& inputs, const std::vector<Routing>& routing,
                                  const ExpertWeights& weights, const std::vector<StepPlan>& plans,
                                  const std::vector<Matrix>& gpu_outputs) {
  const StepRun cpu = run_step(plans, weights, inputs);
  const auto fp64 = fp64_reference(world, inputs, routing, weights);
  OracleErrors e;
  e.vs_cpu = compare(gpu_outputs, cpu.outputs);
  e.vs_fp64 = compare(gpu_outputs, fp64);
  e.cpu_vs_fp64 = compare(cpu.outputs, fp64);
  return e;
}

}  // namespace tilemoe::gpu_checks
