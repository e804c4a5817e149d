#pragma once
// The CPU executor: runs the plans of one step with each rank a group of threads of this
// process, compute workers and communication workers apart (the CPU analogue of compute SMs
// and communication SMs), over the shared-memory transport. It makes no scheduling decision:
// workers claim their queue's tasks in order, wait for each task's flags, run it, signal.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "tilemoe/plan.hpp"
#include "tilemoe/tensor.hpp"
#include "tilemoe/step_trace.hpp"
#include "tilemoe/weights.hpp"

namespace tilemoe {

struct CpuRunOptions {
  std::chrono::milliseconds timeout{30000};  // bound of every wait
  std::uint32_t max_delay_us = 0;  // each task starts after a random delay in [0, max]: shakes timing
  std::uint64_t delay_seed = 1;
  bool poison = true;               // fill every buffer with NaN first, so a missed write shows
  double link_gbps = 0.0;           // per-rank outgoing link emulation, GB/s; 0 = unlimited
  int silent_rank = -1;             // fault injection: this rank's comm workers never start
  std::atomic<std::uint64_t>* tasks_done = nullptr;  // progress, if given
};

struct StepRun {
  std::vector<Matrix> outputs;  // per rank, [tokens, hidden]
  std::vector<TaskRecord> records;
  std::int64_t wall_ns = 0;
};

// inputs[r] is rank r's [tokens, hidden] in the plans' dtype. Errors: a bad-input Error for
// inputs that do not match the plans; a Timeout Error naming rank, peer and flag when a wait
// expires (the whole step stops; no output is returned).
StepRun run_step(const std::vector<StepPlan>& plans, const ExpertWeights& weights,
                 const std::vector<Matrix>& inputs, const CpuRunOptions& options = {});

}  // namespace tilemoe
