#include "tilemoe/trace.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "tilemoe/error.hpp"

namespace tilemoe {

namespace {

using Interval = std::pair<std::int64_t, std::int64_t>;

std::vector<Interval> merged(std::vector<Interval> spans) {
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

std::int64_t length(const std::vector<Interval>& spans) {
  std::int64_t n = 0;
  for (const Interval& s : spans) n += s.second - s.first;
  return n;
}

std::int64_t intersection(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::int64_t n = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const std::int64_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) n += hi - lo;
    (a[i].second < b[j].second) ? ++i : ++j;
  }
  return n;
}

// {"traceEvents": events} staged for `path` (written and flushed under a temporary name), so a
// failure leaves nothing half-written there.
StagedFile stage_trace_events(const std::string& path, const nlohmann::json& events) {
  const nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  check_output_target(path, "the trace");
  StagedFile file(path);
  file.write(doc.dump());
  file.finish();
  return file;
}

bool is_remote_segment(const StepPlan& plan, TaskRef task) {
  return task.kind == TaskKind::Segment && plan.segments[task.index].dest_rank != plan.rank;
}

}  // namespace

StepStats summarize(const std::vector<StepPlan>& plans, const std::vector<TaskRecord>& records, std::int64_t wall_ns) {
  StepStats stats;
  stats.wall_ms = static_cast<double>(wall_ns) / 1e6;
  if (wall_ns <= 0) return stats;
  std::int64_t compute_ns = 0, comm_ns = 0, compute_slots = 0, comm_slots = 0;
  for (const StepPlan& p : plans) {
    compute_slots += p.compute_workers;
    comm_slots += p.comm_workers;
  }
  std::vector<std::vector<Interval>> gemm(plans.size()), remote(plans.size());
  for (const TaskRecord& r : records) {
    const StepPlan& p = plans[static_cast<std::size_t>(r.rank)];
    (r.worker_class == WorkerClass::Compute ? compute_ns : comm_ns) += r.end_ns - r.start_ns;
    if (r.task.kind == TaskKind::Gemm) gemm[static_cast<std::size_t>(r.rank)].push_back({r.start_ns, r.end_ns});
    if (is_remote_segment(p, r.task)) remote[static_cast<std::size_t>(r.rank)].push_back({r.start_ns, r.end_ns});
  }
  stats.compute_busy = static_cast<double>(compute_ns) / (static_cast<double>(wall_ns) * static_cast<double>(compute_slots));
  stats.comm_busy = static_cast<double>(comm_ns) / (static_cast<double>(wall_ns) * static_cast<double>(comm_slots));
  std::int64_t comm_total = 0, hidden = 0;
  for (std::size_t r = 0; r < plans.size(); ++r) {
    const auto g = merged(gemm[r]), c = merged(remote[r]);
    comm_total += length(c);
    hidden += intersection(g, c);
  }
  stats.overlap = comm_total > 0 ? static_cast<double>(hidden) / static_cast<double>(comm_total) : 0.0;
  return stats;
}

void write_trace(const std::string& path, const std::vector<TracedStep>& steps) { stage_trace(path, steps).commit(); }

StagedFile stage_trace(const std::string& path, const std::vector<TracedStep>& steps) {
  using nlohmann::json;
  json events = json::array();
  double offset_us = 0.0;  // each step starts where the previous one ended, plus a gap
  int pid_base = 0;
  for (const TracedStep& step : steps) {
    const auto& plans = *step.plans;
    const auto& records = *step.records;
    auto tid = [&](const TaskRecord& r) {
      return r.worker_class == WorkerClass::Compute ? r.worker : plans[static_cast<std::size_t>(r.rank)].compute_workers + r.worker;
    };
    auto ts = [&](std::int64_t ns) { return offset_us + static_cast<double>(ns) / 1e3; };
    for (const StepPlan& p : plans) {
      const int pid = pid_base + p.rank;
      events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", step.label + " rank " + std::to_string(p.rank)}}}});
      events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
      for (int w = 0; w < p.compute_workers + p.comm_workers; ++w) {
        const std::string name = w < p.compute_workers ? "compute " + std::to_string(w) : "comm " + std::to_string(w - p.compute_workers);
        events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", w}, {"args", {{"name", name}}}});
      }
    }
    // where each (rank, task) ran, for the flow arrows
    std::map<std::pair<int, std::pair<int, std::uint32_t>>, const TaskRecord*> placed;
    std::int64_t end_ns = 0;
    for (const TaskRecord& r : records) {
      const StepPlan& p = plans[static_cast<std::size_t>(r.rank)];
      std::string name;
      if (r.task.kind == TaskKind::Gemm) {
        const GemmTile& t = p.tiles[r.task.index];
        name = "gemm" + std::to_string(t.layer) + " e" + std::to_string(p.experts[static_cast<std::size_t>(t.expert)].global_id);
      } else if (r.task.kind == TaskKind::Segment) {
        const Segment& s = p.segments[r.task.index];
        name = std::string(s.dst == BufferId::ExpertIn ? "dispatch" : "combine send") + " -> " + std::to_string(s.dest_rank);
      } else {
        name = "top-k sum";
      }
      events.push_back({{"ph", "X"}, {"name", name}, {"cat", std::string(task_kind_name(r.task.kind))}, {"pid", pid_base + r.rank},
                        {"tid", tid(r)}, {"ts", ts(r.start_ns)},
                        {"dur", std::max(0.001, static_cast<double>(r.end_ns - r.start_ns) / 1e3)},
                        {"args", {{"task", describe_task(p, r.task)}}}});
      placed[{r.rank, {static_cast<int>(r.task.kind), r.task.index}}] = &r;
      end_ns = std::max(end_ns, r.end_ns);
    }
    // a flow from each tile to every segment that waits for the tile's own flag
    for (const StepPlan& p : plans) {
      std::map<std::uint32_t, std::vector<std::uint32_t>> tiles_of_flag;
      for (std::uint32_t i = 0; i < p.tiles.size(); ++i) {
        if (p.tiles[i].signal_flag != kNoFlag) tiles_of_flag[static_cast<std::uint32_t>(p.tiles[i].signal_flag)].push_back(i);
      }
      for (std::uint32_t si = 0; si < p.segments.size(); ++si) {
        const Segment& s = p.segments[si];
        auto seg = placed.find({p.rank, {static_cast<int>(TaskKind::Segment), si}});
        if (seg == placed.end()) continue;
        for (std::uint32_t w = s.wait_begin; w < s.wait_begin + s.wait_count; ++w) {
          auto tiles = tiles_of_flag.find(p.waits[w].flag);
          if (tiles == tiles_of_flag.end() || tiles->second.size() != 1) continue;  // per-tile flags only
          auto tile = placed.find({p.rank, {static_cast<int>(TaskKind::Gemm), tiles->second.front()}});
          if (tile == placed.end()) continue;
          const TaskRecord& a = *tile->second;
          const TaskRecord& b = *seg->second;
          const std::uint64_t id = events.size();
          events.push_back({{"ph", "s"}, {"name", "ready"}, {"cat", "flag"}, {"id", id}, {"pid", pid_base + a.rank}, {"tid", tid(a)},
                            {"ts", ts(a.end_ns) - 0.0005}});
          events.push_back({{"ph", "f"}, {"bp", "e"}, {"name", "ready"}, {"cat", "flag"}, {"id", id}, {"pid", pid_base + b.rank},
                            {"tid", tid(b)}, {"ts", ts(b.start_ns)}});
        }
      }
    }
    offset_us = ts(end_ns) + 100.0;
    pid_base += static_cast<int>(plans.size());
  }
  return stage_trace_events(path, events);
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
    const auto m = merged(c);
    total += length(m);
    hidden += intersection(merged(compute[rank]), m);
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
