#include "tilemoe/trace.hpp"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "tilemoe/error.hpp"
#include "trace_events.hpp"

namespace tilemoe {

std::vector<Interval> merge_intervals(std::vector<Interval> spans) {
  std::sort(spans.begin(), spans.end());
  std::vector<Interval> out;
  for (const Interval& s : spans) {
    if (!out.empty() && s.first <= out.back().second) {
      out.back().second = std::max(out.back().second, s.second);
    } else {
      out.push_back(s);
    }
  }
  return out;
}

std::int64_t total_length(const std::vector<Interval>& spans) {
  std::int64_t n = 0;
  for (const Interval& s : spans) n += s.second - s.first;
  return n;
}

std::int64_t overlap_length(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::int64_t n = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const std::int64_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) n += hi - lo;
    (a[i].second < b[j].second) ? ++i : ++j;
  }
  return n;
}

StagedFile stage_trace_events(const std::string& path, const nlohmann::json& events) {
  const nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  check_output_target(path, "the trace");
  StagedFile file(path);
  file.write(doc.dump());
  file.finish();
  return file;
}

double hidden_share(const std::vector<DeviceSpan>& spans, const std::string& compute_track, const std::string& comm_track) {
  std::map<std::int32_t, std::vector<Interval>> compute, comm;
  for (const DeviceSpan& s : spans) {
    const Interval span{static_cast<std::int64_t>(s.start_ns), static_cast<std::int64_t>(s.end_ns)};
    if (s.track == compute_track) compute[s.rank].push_back(span);
    if (s.track == comm_track && s.remote) comm[s.rank].push_back(span);
  }
  std::int64_t total = 0, hidden = 0;
  for (auto& [rank, c] : comm) {
    const auto m = merge_intervals(c);
    total += total_length(m);
    hidden += overlap_length(merge_intervals(compute[rank]), m);
  }
  return total > 0 ? static_cast<double>(hidden) / static_cast<double>(total) : 0.0;
}

void write_device_trace(const std::string& path, const std::string& label, const std::vector<DeviceSpan>& spans) {
  using nlohmann::json;
  json events = json::array();
  std::uint64_t origin = ~0ull;
  for (const DeviceSpan& s : spans) origin = std::min(origin, s.start_ns);
  std::map<std::int32_t, std::map<std::pair<std::string, std::int32_t>, int>> tracks;  // rank -> (track, lane) -> tid
  for (const DeviceSpan& s : spans) {
    auto& mine = tracks[s.rank];
    if (mine.count({s.track, s.lane})) continue;
    const int tid = static_cast<int>(mine.size());
    mine[{s.track, s.lane}] = tid;
    if (tid == 0) {
      events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", s.rank}, {"args", {{"name", label + " rank " + std::to_string(s.rank)}}}});
      events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", s.rank}, {"args", {{"sort_index", s.rank}}}});
    }
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", s.rank}, {"tid", tid},
                      {"args", {{"name", s.track + " " + std::to_string(s.lane)}}}});
  }
  for (const DeviceSpan& s : spans) {
    const double start_us = static_cast<double>(s.start_ns - origin) / 1e3;
    const double dur_us = s.end_ns > s.start_ns ? static_cast<double>(s.end_ns - s.start_ns) / 1e3 : 0.001;
    events.push_back({{"ph", "X"}, {"name", s.label}, {"cat", s.remote ? "remote" : "local"}, {"pid", s.rank},
                      {"tid", tracks[s.rank][{s.track, s.lane}]}, {"ts", start_us}, {"dur", std::max(0.001, dur_us)}});
  }
  stage_trace_events(path, events).commit();
}

}  // namespace tilemoe
