#pragma once
// What the CPU executor records of a step (a span per plan task on its worker's track) and what
// is made of it: busy shares, overlap, and a Chrome / Perfetto trace-event file.
#include <cstdint>
#include <string>
#include <vector>

#include "tilemoe/plan.hpp"
#include "tilemoe/staged_file.hpp"

namespace tilemoe {

enum class WorkerClass : std::uint8_t { Compute, Comm };

struct TaskRecord {
  std::int32_t rank = 0;
  WorkerClass worker_class = WorkerClass::Compute;
  std::int32_t worker = 0;
  TaskRef task;
  std::int64_t start_ns = 0;  // after its waits were satisfied
  std::int64_t end_ns = 0;    // after its signal was raised
};

struct StepStats {
  double wall_ms = 0.0;
  double compute_busy = 0.0;  // share of compute-worker time spent in tasks
  double comm_busy = 0.0;     // share of comm-worker time spent in tasks
  // Share of the time some communication (a remote segment) ran while some GEMM ran on the
  // same rank, over the time remote segments ran: the communication hidden under compute.
  double overlap = 0.0;
};
StepStats summarize(const std::vector<StepPlan>& plans, const std::vector<TaskRecord>& records,
                    std::int64_t wall_ns);

// One executed step for a trace file.
struct TracedStep {
  std::string label;  // e.g. the strategy; names the step's processes
  const std::vector<StepPlan>* plans = nullptr;
  const std::vector<TaskRecord>* records = nullptr;
};

// Trace-event JSON (Chrome / Perfetto): a process per rank of each step, a thread per worker,
// a span per task, and a flow arrow to each segment from the tile that completed a row band's
// ready flag the segment waits for. Steps are laid one after another on the time axis. Written atomically.
void write_trace(const std::string& path, const std::vector<TracedStep>& steps);
// The same, written and flushed under a temporary name, for the caller to commit() together
// with the step's other files once all are written.
StagedFile stage_trace(const std::string& path, const std::vector<TracedStep>& steps);

}  // namespace tilemoe
