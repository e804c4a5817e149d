#pragma once
// The parts of a trace file every tracer shares: intervals (busy time, overlap) and the
// trace-event JSON file (Chrome / Perfetto), written atomically.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tilemoe/staged_file.hpp"

namespace tilemoe {

using Interval = std::pair<std::int64_t, std::int64_t>;

// Sorted, overlapping spans joined.
std::vector<Interval> merge_intervals(std::vector<Interval> spans);
// Total length of disjoint spans.
std::int64_t total_length(const std::vector<Interval>& spans);
// Length of the intersection of two sorted lists of disjoint spans.
std::int64_t overlap_length(const std::vector<Interval>& a, const std::vector<Interval>& b);

// {"traceEvents": events} staged for `path` (written and flushed under a temporary name), so a
// failure leaves nothing half-written there; the caller commits it.
StagedFile stage_trace_events(const std::string& path, const nlohmann::json& events);

}  // namespace tilemoe
