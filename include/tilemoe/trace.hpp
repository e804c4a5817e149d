#pragma once
// Spans measured on a GPU and what is made of them: the share of communication hidden under
// compute, and a Chrome / Perfetto trace-event file. (The CPU executor's trace of a plan's
// tasks: tilemoe/step_trace.hpp.)
#include <cstdint>
#include <string>
#include <vector>

namespace tilemoe {

// A span measured on a GPU (%globaltimer ns): the GPU executors' traces. `track` names what
// ran ("GEMM1 tiles", "consumer"), `lane` which of its CTAs (a trace thread per track and
// lane); `remote` marks communication of rows for other ranks.
struct DeviceSpan {
  std::int32_t rank = 0;
  std::string track;
  std::int32_t lane = 0;
  std::string label;
  std::uint64_t start_ns = 0;
  std::uint64_t end_ns = 0;
  bool remote = false;
};

// Share of the remote spans of `comm_track` that ran while some span of `compute_track` ran on
// the same rank: the communication hidden under compute (0 if there is none).
double hidden_share(const std::vector<DeviceSpan>& spans, const std::string& compute_track, const std::string& comm_track);

// Trace-event JSON (Chrome / Perfetto): a process per rank, a thread per track and lane, a
// span per DeviceSpan, times relative to the earliest span. Written atomically.
void write_device_trace(const std::string& path, const std::string& label, const std::vector<DeviceSpan>& spans);

}  // namespace tilemoe
