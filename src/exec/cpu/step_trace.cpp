#include "tilemoe/step_trace.hpp"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "core/trace_events.hpp"

namespace tilemoe {

namespace {

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
    const auto g = merge_intervals(gemm[r]), c = merge_intervals(remote[r]);
    comm_total += total_length(c);
    hidden += overlap_length(g, c);
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
    // a flow to every segment from the tile that completed a row band's ready flag it waits for
    // (flags of one row band only: a phase counter raised by many bands would draw a thicket)
    for (const StepPlan& p : plans) {
      struct BandFlag {
        const GemmTile* first = nullptr;  // its first tile, for the band it belongs to
        bool one_band = true;
        const TaskRecord* last = nullptr;  // the tile that completed it
      };
      std::map<std::uint32_t, BandFlag> band_flags;
      for (std::uint32_t i = 0; i < p.tiles.size(); ++i) {
        const GemmTile& t = p.tiles[i];
        if (t.signal_flag == kNoFlag) continue;
        BandFlag& f = band_flags[static_cast<std::uint32_t>(t.signal_flag)];
        if (f.first == nullptr) f.first = &t;
        f.one_band = f.one_band && t.expert == f.first->expert && t.row_begin == f.first->row_begin;
        auto tile = placed.find({p.rank, {static_cast<int>(TaskKind::Gemm), i}});
        if (tile != placed.end() && (f.last == nullptr || tile->second->end_ns > f.last->end_ns)) f.last = tile->second;
      }
      for (std::uint32_t si = 0; si < p.segments.size(); ++si) {
        const Segment& s = p.segments[si];
        auto seg = placed.find({p.rank, {static_cast<int>(TaskKind::Segment), si}});
        if (seg == placed.end()) continue;
        for (std::uint32_t w = s.wait_begin; w < s.wait_begin + s.wait_count; ++w) {
          auto flag = band_flags.find(p.waits[w].flag);
          if (flag == band_flags.end() || !flag->second.one_band || flag->second.last == nullptr) continue;
          const TaskRecord& a = *flag->second.last;
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

}  // namespace tilemoe
