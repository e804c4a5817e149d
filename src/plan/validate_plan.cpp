// validate_plan: proves a step's plans safe to run before anything runs.
//
//  1. every index, row, column and flag lies inside what it points into;
//  2. every buffer region that a step writes is written exactly once (ExpertIn by dispatch
//     segments and padding, Received by dispatch segments, Activation and ExpertOut by GEMM
//     tiles, CombineIn by segments, Output by combine tasks), and every task sits in exactly one
//     queue once;
//  3. every wait names a flag raised by exactly `expected` tasks, all of rank `from_rank`
//     (a combine task's waits for its rows: each row's arrival flag raised exactly once);
//  4. every read is ordered after the writes it reads: the writer raises a flag the reader
//     waits for (a direct wait; the plans tilemoe compiles need no more, and a checker that
//     demands it is simple enough to trust);
//  5. the graph of tasks, flags and queue order across all ranks has no cycle. Queue order
//     counts as "the next task starts after this one ends", the case of a single worker, so
//     the plans cannot deadlock whatever the number of workers and their relative speed.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "tilemoe/error.hpp"
#include "tilemoe/plan.hpp"

namespace tilemoe {

namespace {

[[noreturn]] void reject(const std::string& message) { throw_bad_input("plan check failed: " + message); }

struct Written {
  std::int64_t col_begin, col_end;
  std::int64_t writer;  // global task id, -1 = before the step (padding)
};

class PlanChecker {
 public:
  explicit PlanChecker(const std::vector<StepPlan>& plans) : plans_(plans) {}

  void run() {
    check_shapes();
    number_tasks();
    for (const StepPlan& plan : plans_) check_bounds(plan);
    check_queues();
    collect_signals();
    check_waits();
    collect_writes();
    check_coverage();
    check_read_order();
    check_acyclic();
  }

 private:
  const std::vector<StepPlan>& plans_;
  std::vector<std::int64_t> task_base_;  // global id of a rank's first task
  std::vector<std::int64_t> flag_base_;
  std::int64_t task_total_ = 0, flag_total_ = 0;
  std::vector<std::vector<std::int64_t>> signalers_;  // per global flag
  // The flags a task raises: global flags [first, first + count), one for all its rows, or a
  // flag per row (a segment's flag_per_row: row x's is first + x - row0).
  struct Raised {
    std::int64_t first = -1, count = 0, row0 = 0;
    bool per_row = false;
    std::int64_t flag_of_row(std::int64_t row) const { return per_row ? first + (row - row0) : first; }
  };
  std::vector<Raised> raised_;  // per task
  // writes_[rank][buffer][row]
  std::vector<std::vector<std::vector<std::vector<Written>>>> writes_;

  int world() const { return static_cast<int>(plans_.size()); }

  std::int64_t task_id(int rank, TaskRef ref) const {
    const StepPlan& p = plans_[static_cast<std::size_t>(rank)];
    std::int64_t local = ref.index;
    if (ref.kind == TaskKind::Segment) local += static_cast<std::int64_t>(p.tiles.size());
    if (ref.kind == TaskKind::Combine) local += static_cast<std::int64_t>(p.tiles.size() + p.segments.size());
    return task_base_[static_cast<std::size_t>(rank)] + local;
  }

  std::pair<int, TaskRef> task_of(std::int64_t id) const {
    int rank = 0;
    while (rank + 1 < world() && task_base_[static_cast<std::size_t>(rank + 1)] <= id) ++rank;
    const StepPlan& p = plans_[static_cast<std::size_t>(rank)];
    auto local = static_cast<std::size_t>(id - task_base_[static_cast<std::size_t>(rank)]);
    if (local < p.tiles.size()) return {rank, {TaskKind::Gemm, static_cast<std::uint32_t>(local)}};
    local -= p.tiles.size();
    if (local < p.segments.size()) return {rank, {TaskKind::Segment, static_cast<std::uint32_t>(local)}};
    local -= p.segments.size();
    return {rank, {TaskKind::Combine, static_cast<std::uint32_t>(local)}};
  }

  std::string name(std::int64_t id) const {
    if (id < 0) return "the step's set-up (padding)";
    auto [rank, ref] = task_of(id);
    return describe_task(plans_[static_cast<std::size_t>(rank)], ref);
  }

  std::int64_t flag_id(int rank, std::uint32_t flag) const {
    return flag_base_[static_cast<std::size_t>(rank)] + flag;
  }

  void check_shapes() {
    if (plans_.empty()) reject("there are no plans");
    const StepPlan& first = plans_.front();
    for (int r = 0; r < world(); ++r) {
      const StepPlan& p = plans_[static_cast<std::size_t>(r)];
      const std::string who = "rank " + std::to_string(r) + ": ";
      if (p.rank != r) reject(who + "plan says it is rank " + std::to_string(p.rank));
      if (p.world_size != world()) reject(who + "world size " + std::to_string(p.world_size) + " but " + std::to_string(world()) + " plans");
      if (p.hidden != first.hidden || p.ffn_hidden != first.ffn_hidden || p.top_k != first.top_k ||
          p.dtype != first.dtype || p.activation != first.activation || p.strategy != first.strategy ||
          p.experts.size() != first.experts.size()) {
        reject(who + "layer shape or strategy differs from rank 0's");
      }
      if (p.tokens < 0 || p.expert_rows < 0 || p.combine_rows < 0 || p.received_rows < 0 || p.hidden <= 0 || p.ffn_hidden <= 0 || p.top_k <= 0) {
        reject(who + "negative or zero sizes");
      }
      if (p.compute_workers < 1 || p.comm_workers < 1) reject(who + "needs at least one worker of each class");
      const auto slots = static_cast<std::size_t>(p.tokens * p.top_k);
      if (p.combine_source_row.size() != slots || p.combine_weight.size() != slots) {
        reject(who + "combine tables hold " + std::to_string(p.combine_source_row.size()) + " slots, expected tokens x top_k = " + std::to_string(slots));
      }
      std::int64_t row = 0;
      for (std::size_t e = 0; e < p.experts.size(); ++e) {
        const LocalExpert& x = p.experts[e];
        if (x.row_begin != row || x.row_end < x.row_begin) reject(who + "expert " + std::to_string(e) + " rows do not follow the previous expert's");
        if (x.global_id != static_cast<std::int32_t>(r * p.experts.size() + e)) reject(who + "local expert " + std::to_string(e) + " is global expert " + std::to_string(x.global_id) + ", not the one rank " + std::to_string(r) + " owns");
        row = x.row_end;
      }
      if (row != p.expert_rows) reject(who + "experts cover " + std::to_string(row) + " rows, the buffer has " + std::to_string(p.expert_rows));
    }
  }

  void number_tasks() {
    for (const StepPlan& p : plans_) {
      task_base_.push_back(task_total_);
      flag_base_.push_back(flag_total_);
      task_total_ += static_cast<std::int64_t>(p.task_count());
      flag_total_ += p.flag_count;
    }
  }

  void check_waits_range(const StepPlan& p, std::uint32_t begin, std::uint32_t count, const std::string& who) {
    if (begin > p.waits.size() || count > p.waits.size() - begin) reject(who + ": its waits lie outside the wait table");
    for (std::uint32_t i = begin; i < begin + count; ++i) {
      const FlagWait& w = p.waits[i];
      if (w.flag >= p.flag_count) reject(who + ": waits for flag " + std::to_string(w.flag) + " of " + std::to_string(p.flag_count));
      if (w.from_rank < 0 || w.from_rank >= world()) reject(who + ": waits for a signal from rank " + std::to_string(w.from_rank));
      if (w.expected == 0) reject(who + ": waits for zero signals of flag " + std::to_string(w.flag));
    }
  }

  static bool rows_inside(std::int64_t begin, std::int64_t count, std::int64_t limit) {
    return begin >= 0 && count >= 0 && begin <= limit && count <= limit - begin;
  }

  void check_bounds(const StepPlan& p) {
    for (std::uint32_t i = 0; i < p.tiles.size(); ++i) {
      const GemmTile& t = p.tiles[i];
      const std::string who = describe_task(p, {TaskKind::Gemm, i});
      if (t.layer > 1) reject(who + ": layer " + std::to_string(t.layer));
      if (t.expert < 0 || t.expert >= static_cast<std::int32_t>(p.experts.size())) reject(who + ": no such local expert");
      const LocalExpert& x = p.experts[static_cast<std::size_t>(t.expert)];
      if (t.row_begin < x.row_begin || t.row_end > x.row_end || t.row_begin > t.row_end) reject(who + ": rows outside its expert's " + std::to_string(x.row_begin) + ".." + std::to_string(x.row_end));
      // a tile of no rows is a cluster mate's padding (the GPU runs tiles in pairs): it computes
      // nothing, so it must not tell anyone it has
      if (t.row_begin == t.row_end && t.signal_flag != kNoFlag) reject(who + ": has no rows but raises flag " + std::to_string(t.signal_flag));
      const std::int64_t cols = t.layer == 0 ? p.ffn_hidden : p.hidden;
      if (t.col_begin < 0 || t.col_end > cols || t.col_begin >= t.col_end) reject(who + ": columns outside 0.." + std::to_string(cols));
      if (t.signal_flag != kNoFlag && (t.signal_flag < 0 || static_cast<std::uint32_t>(t.signal_flag) >= p.flag_count)) reject(who + ": raises flag " + std::to_string(t.signal_flag) + " of " + std::to_string(p.flag_count));
      check_waits_range(p, t.wait_begin, t.wait_count, who);
    }
    for (std::uint32_t i = 0; i < p.segments.size(); ++i) {
      const Segment& s = p.segments[i];
      const std::string who = describe_task(p, {TaskKind::Segment, i});
      if (static_cast<int>(s.src) >= kBufferCount || s.src == BufferId::Output) reject(who + ": cannot read that buffer");
      if (s.dst != BufferId::ExpertIn && s.dst != BufferId::CombineIn && s.dst != BufferId::Received) {
        reject(who + ": may write only ExpertIn, CombineIn or Received");
      }
      if (s.dest_rank < 0 || s.dest_rank >= world()) reject(who + ": no such destination rank");
      const StepPlan& d = plans_[static_cast<std::size_t>(s.dest_rank)];
      // a segment of no rows (an empty group) moves nothing but may raise its flag: a receiver
      // can then expect a count fixed by the layer's shape, not by the routing
      if (s.rows < 0) reject(who + ": moves " + std::to_string(s.rows) + " rows");
      if (p.buffer_cols(s.src) != d.buffer_cols(s.dst) || s.col_begin < 0 || s.col_end > p.buffer_cols(s.src) || s.col_begin >= s.col_end) reject(who + ": columns out of bounds");
      if (s.gather_count > 0) {
        if (s.gather_count != s.rows) reject(who + ": gathers " + std::to_string(s.gather_count) + " rows but moves " + std::to_string(s.rows));
        if (s.gather_begin > p.gather_rows.size() || s.gather_count > p.gather_rows.size() - s.gather_begin) reject(who + ": gather list outside the gather table");
        for (std::uint32_t g = s.gather_begin; g < s.gather_begin + s.gather_count; ++g) {
          if (p.gather_rows[g] < 0 || p.gather_rows[g] >= p.buffer_rows(s.src)) reject(who + ": gathers row " + std::to_string(p.gather_rows[g]) + " of " + std::to_string(p.buffer_rows(s.src)));
        }
      } else if (!rows_inside(s.src_row, s.rows, p.buffer_rows(s.src))) {
        reject(who + ": source rows outside " + std::string(buffer_name(s.src)) + " (" + std::to_string(p.buffer_rows(s.src)) + " rows)");
      }
      if (!rows_inside(s.dst_row, s.rows, d.buffer_rows(s.dst))) reject(who + ": destination rows outside rank " + std::to_string(s.dest_rank) + "'s " + std::string(buffer_name(s.dst)) + " (" + std::to_string(d.buffer_rows(s.dst)) + " rows)");
      const std::int64_t raises = s.flag_per_row != 0 ? s.rows : 1;  // flags from dest_flag on
      if (s.flag_per_row != 0 && s.dest_flag == kNoFlag) reject(who + ": raises a flag per row but names none");
      // a flag per CombineIn row is that row's arrival flag (so a GPU executor may keep them by row)
      if (s.flag_per_row != 0 && s.dst == BufferId::CombineIn && s.dest_flag != static_cast<std::int64_t>(d.row_arrival_flag) + s.dst_row) {
        reject(who + ": raises flags from " + std::to_string(s.dest_flag) + " for CombineIn rows from " + std::to_string(s.dst_row) +
               ", not their arrival flags (rank " + std::to_string(s.dest_rank) + "'s from " + std::to_string(d.row_arrival_flag) + ")");
      }
      if (s.dest_flag != kNoFlag && (s.dest_flag < 0 || s.dest_flag + raises > d.flag_count)) reject(who + ": raises flag " + std::to_string(s.dest_flag) + (s.flag_per_row != 0 ? " + " + std::to_string(s.rows) + " rows" : std::string()) + " of rank " + std::to_string(s.dest_rank) + "'s " + std::to_string(d.flag_count));
      check_waits_range(p, s.wait_begin, s.wait_count, who);
    }
    for (std::uint32_t i = 0; i < p.combines.size(); ++i) {
      const CombineTask& c = p.combines[i];
      const std::string who = describe_task(p, {TaskKind::Combine, i});
      if (c.token_begin < 0 || c.token_end > p.tokens || c.token_begin >= c.token_end) reject(who + ": tokens outside 0.." + std::to_string(p.tokens));
      if (c.waits_for_rows != 0 && static_cast<std::int64_t>(p.row_arrival_flag) + p.combine_rows > p.flag_count) {
        reject(who + ": waits for its rows' arrival flags " + std::to_string(p.row_arrival_flag) + " + " + std::to_string(p.combine_rows) +
               " rows, past the rank's " + std::to_string(p.flag_count) + " flags");
      }
      if (c.col_begin < 0 || c.col_end > p.hidden || c.col_begin >= c.col_end) reject(who + ": columns outside 0.." + std::to_string(p.hidden));
      check_waits_range(p, c.wait_begin, c.wait_count, who);
    }
    for (std::size_t s = 0; s < p.combine_source_row.size(); ++s) {
      const std::int64_t row = p.combine_source_row[s];
      if (row < -1 || row >= p.combine_rows) reject("rank " + std::to_string(p.rank) + ": slot " + std::to_string(s) + " reads CombineIn row " + std::to_string(row) + " of " + std::to_string(p.combine_rows));
      if (!std::isfinite(p.combine_weight[s])) reject("rank " + std::to_string(p.rank) + ": slot " + std::to_string(s) + " has a non-finite weight");
    }
    if (!p.expert_in_scale.empty() && p.expert_in_scale.size() != static_cast<std::size_t>(p.expert_rows)) {
      reject("rank " + std::to_string(p.rank) + ": " + std::to_string(p.expert_in_scale.size()) + " input scales for " +
             std::to_string(p.expert_rows) + " expert rows");
    }
    for (float scale : p.expert_in_scale) {
      if (!std::isfinite(scale)) reject("rank " + std::to_string(p.rank) + ": a non-finite input scale");
    }
    for (const RowRange& z : p.zero_rows) {
      if (z.begin < 0 || z.end > p.expert_rows || z.begin >= z.end) reject("rank " + std::to_string(p.rank) + ": padding rows " + std::to_string(z.begin) + ".." + std::to_string(z.end) + " outside ExpertIn");
    }
  }

  void check_queues() {
    for (int r = 0; r < world(); ++r) {
      const StepPlan& p = plans_[static_cast<std::size_t>(r)];
      std::vector<int> seen(p.task_count(), 0);
      for (const auto* queue : {&p.compute_queue, &p.comm_queue}) {
        for (TaskRef ref : *queue) {
          const std::size_t limit = ref.kind == TaskKind::Gemm ? p.tiles.size() : ref.kind == TaskKind::Segment ? p.segments.size() : p.combines.size();
          if (static_cast<int>(ref.kind) > 2 || ref.index >= limit) reject("rank " + std::to_string(r) + ": a queue names a task that does not exist");
          ++seen[static_cast<std::size_t>(task_id(r, ref) - task_base_[static_cast<std::size_t>(r)])];
        }
      }
      for (std::size_t i = 0; i < seen.size(); ++i) {
        if (seen[i] != 1) {
          reject(name(task_base_[static_cast<std::size_t>(r)] + static_cast<std::int64_t>(i)) + " is queued " + std::to_string(seen[i]) + " times, not once");
        }
      }
    }
  }

  void collect_signals() {
    signalers_.assign(static_cast<std::size_t>(flag_total_), {});
    raised_.assign(static_cast<std::size_t>(task_total_), {});
    auto raise = [&](std::int64_t task, Raised r) {
      for (std::int64_t f = r.first; f < r.first + r.count; ++f) signalers_[static_cast<std::size_t>(f)].push_back(task);
      raised_[static_cast<std::size_t>(task)] = r;
    };
    for (int r = 0; r < world(); ++r) {
      const StepPlan& p = plans_[static_cast<std::size_t>(r)];
      for (std::uint32_t i = 0; i < p.tiles.size(); ++i) {
        if (p.tiles[i].signal_flag == kNoFlag) continue;
        raise(task_id(r, {TaskKind::Gemm, i}), Raised{flag_id(r, static_cast<std::uint32_t>(p.tiles[i].signal_flag)), 1, 0, false});
      }
      for (std::uint32_t i = 0; i < p.segments.size(); ++i) {
        const Segment& s = p.segments[i];
        if (s.dest_flag == kNoFlag) continue;
        const std::int64_t first = flag_id(s.dest_rank, static_cast<std::uint32_t>(s.dest_flag));
        raise(task_id(r, {TaskKind::Segment, i}),
              s.flag_per_row != 0 ? Raised{first, s.rows, s.dst_row, true} : Raised{first, 1, 0, false});
      }
    }
    // One flag, one signalling rank: a timed-out wait can then name the peer that stalled.
    for (const auto& who : signalers_) {
      for (std::int64_t s : who) {
        if (task_of(s).first != task_of(who.front()).first) {
          reject(name(who.front()) + " and " + name(s) + " raise the same flag from different ranks");
        }
      }
    }
  }

  template <typename F>
  void for_each_task(F&& f) const {
    for (int r = 0; r < world(); ++r) {
      const StepPlan& p = plans_[static_cast<std::size_t>(r)];
      for (std::uint32_t i = 0; i < p.tiles.size(); ++i) f(r, TaskRef{TaskKind::Gemm, i}, p.tiles[i].wait_begin, p.tiles[i].wait_count);
      for (std::uint32_t i = 0; i < p.segments.size(); ++i) f(r, TaskRef{TaskKind::Segment, i}, p.segments[i].wait_begin, p.segments[i].wait_count);
      for (std::uint32_t i = 0; i < p.combines.size(); ++i) f(r, TaskRef{TaskKind::Combine, i}, p.combines[i].wait_begin, p.combines[i].wait_count);
    }
  }

  // The CombineIn rows a combine task reads, when it waits for their arrival flags.
  template <typename F>
  void for_each_awaited_row(const StepPlan& p, TaskRef ref, F&& f) const {
    if (ref.kind != TaskKind::Combine || p.combines[ref.index].waits_for_rows == 0) return;
    const CombineTask& c = p.combines[ref.index];
    for (std::int64_t slot = c.token_begin * p.top_k; slot < c.token_end * p.top_k; ++slot) {
      const std::int64_t row = p.combine_source_row[static_cast<std::size_t>(slot)];
      if (row >= 0) f(row);
    }
  }

  void check_waits() {
    for_each_task([&](int r, TaskRef ref, std::uint32_t begin, std::uint32_t count) {
      const StepPlan& p = plans_[static_cast<std::size_t>(r)];
      for_each_awaited_row(p, ref, [&](std::int64_t row) {
        const auto& who = signalers_[static_cast<std::size_t>(flag_id(r, p.row_arrival_flag) + row)];
        if (who.size() != 1) {
          reject(describe_task(p, ref) + " waits for CombineIn row " + std::to_string(row) + " to land (flag " +
                 std::to_string(p.row_arrival_flag + row) + ") but " + std::to_string(who.size()) + " tasks raise it, not one");
        }
      });
      for (std::uint32_t i = begin; i < begin + count; ++i) {
        const FlagWait& w = p.waits[i];
        const auto& who = signalers_[static_cast<std::size_t>(flag_id(r, w.flag))];
        if (who.size() != w.expected) {
          reject(describe_task(p, ref) + " waits for " + std::to_string(w.expected) + " signals of flag " + std::to_string(w.flag) + " but " + std::to_string(who.size()) + " tasks raise it");
        }
        for (std::int64_t s : {who.front(), who.back()}) {  // all signalers share one rank (collect_signals)
          if (task_of(s).first != w.from_rank) {
            reject(describe_task(p, ref) + " expects flag " + std::to_string(w.flag) + " from rank " + std::to_string(w.from_rank) + " but " + name(s) + " raises it");
          }
        }
      }
    });
  }

  void add_write(int rank, BufferId buffer, std::int64_t row, std::int64_t c0, std::int64_t c1, std::int64_t writer) {
    writes_[static_cast<std::size_t>(rank)][static_cast<std::size_t>(buffer)][static_cast<std::size_t>(row)].push_back({c0, c1, writer});
  }

  void collect_writes() {
    writes_.resize(static_cast<std::size_t>(world()));
    for (int r = 0; r < world(); ++r) {
      const StepPlan& p = plans_[static_cast<std::size_t>(r)];
      writes_[static_cast<std::size_t>(r)].resize(kBufferCount);
      for (int b = 0; b < kBufferCount; ++b) {
        writes_[static_cast<std::size_t>(r)][static_cast<std::size_t>(b)].resize(static_cast<std::size_t>(p.buffer_rows(static_cast<BufferId>(b))));
      }
    }
    for (int r = 0; r < world(); ++r) {
      const StepPlan& p = plans_[static_cast<std::size_t>(r)];
      for (const RowRange& z : p.zero_rows) {
        for (std::int64_t row = z.begin; row < z.end; ++row) add_write(r, BufferId::ExpertIn, row, 0, p.hidden, -1);
      }
      for (std::uint32_t i = 0; i < p.tiles.size(); ++i) {
        const GemmTile& t = p.tiles[i];
        const BufferId out = t.layer == 0 ? BufferId::Activation : BufferId::ExpertOut;
        for (std::int64_t row = t.row_begin; row < t.row_end; ++row) add_write(r, out, row, t.col_begin, t.col_end, task_id(r, {TaskKind::Gemm, i}));
      }
      for (std::uint32_t i = 0; i < p.segments.size(); ++i) {
        const Segment& s = p.segments[i];
        for (std::int64_t row = s.dst_row; row < s.dst_row + s.rows; ++row) add_write(s.dest_rank, s.dst, row, s.col_begin, s.col_end, task_id(r, {TaskKind::Segment, i}));
      }
      for (std::uint32_t i = 0; i < p.combines.size(); ++i) {
        const CombineTask& c = p.combines[i];
        for (std::int64_t token = c.token_begin; token < c.token_end; ++token) add_write(r, BufferId::Output, token, c.col_begin, c.col_end, task_id(r, {TaskKind::Combine, i}));
      }
    }
  }

  void check_coverage() {
    for (int r = 0; r < world(); ++r) {
      const StepPlan& p = plans_[static_cast<std::size_t>(r)];
      for (BufferId b : {BufferId::ExpertIn, BufferId::Activation, BufferId::ExpertOut, BufferId::CombineIn, BufferId::Output, BufferId::Received}) {
        auto& rows = writes_[static_cast<std::size_t>(r)][static_cast<std::size_t>(b)];
        for (std::size_t row = 0; row < rows.size(); ++row) {
          auto& list = rows[row];
          std::sort(list.begin(), list.end(), [](const Written& a, const Written& x) { return a.col_begin < x.col_begin; });
          std::int64_t at = 0;
          for (std::size_t i = 0; i < list.size(); ++i) {
            const std::string where = "rank " + std::to_string(r) + " " + std::string(buffer_name(b)) + " row " + std::to_string(row);
            if (list[i].col_begin > at) reject(where + ": columns " + std::to_string(at) + ".." + std::to_string(list[i].col_begin) + " are never written");
            if (list[i].col_begin < at) reject(where + ": columns from " + std::to_string(list[i].col_begin) + " are written twice, by " + name(list[i - 1].writer) + " and " + name(list[i].writer));
            at = list[i].col_end;
          }
          if (at != p.buffer_cols(b)) {
            reject("rank " + std::to_string(r) + " " + std::string(buffer_name(b)) + " row " + std::to_string(row) + ": columns " + std::to_string(at) + ".." + std::to_string(p.buffer_cols(b)) + " are never written");
          }
        }
      }
    }
  }

  void require_ordered(int rank, BufferId buffer, std::int64_t row, std::int64_t c0, std::int64_t c1, const std::unordered_set<std::int64_t>& waited, std::int64_t reader) {
    if (buffer == BufferId::Input) return;  // written before the step
    for (const Written& w : writes_[static_cast<std::size_t>(rank)][static_cast<std::size_t>(buffer)][static_cast<std::size_t>(row)]) {
      if (w.col_end <= c0 || w.col_begin >= c1 || w.writer < 0) continue;
      const Raised& raised = raised_[static_cast<std::size_t>(w.writer)];
      if (raised.count == 0 || !waited.count(raised.flag_of_row(row))) {
        reject(name(reader) + " reads " + std::string(buffer_name(buffer)) + " row " + std::to_string(row) + " written by " + name(w.writer) + " without waiting for it (a race)");
      }
    }
  }

  void check_read_order() {
    for_each_task([&](int r, TaskRef ref, std::uint32_t begin, std::uint32_t count) {
      const StepPlan& p = plans_[static_cast<std::size_t>(r)];
      std::unordered_set<std::int64_t> waited;
      for (std::uint32_t i = begin; i < begin + count; ++i) waited.insert(flag_id(r, p.waits[i].flag));
      for_each_awaited_row(p, ref, [&](std::int64_t row) { waited.insert(flag_id(r, p.row_arrival_flag) + row); });
      const std::int64_t me = task_id(r, ref);
      if (ref.kind == TaskKind::Gemm) {
        const GemmTile& t = p.tiles[ref.index];
        const BufferId in = t.layer == 0 ? BufferId::ExpertIn : BufferId::Activation;
        for (std::int64_t row = t.row_begin; row < t.row_end; ++row) require_ordered(r, in, row, 0, p.buffer_cols(in), waited, me);
      } else if (ref.kind == TaskKind::Segment) {
        const Segment& s = p.segments[ref.index];
        for (std::int64_t i = 0; i < s.rows; ++i) {
          const std::int64_t row = s.gather_count > 0 ? p.gather_rows[s.gather_begin + static_cast<std::size_t>(i)] : s.src_row + i;
          require_ordered(r, s.src, row, s.col_begin, s.col_end, waited, me);
        }
      } else {
        const CombineTask& c = p.combines[ref.index];
        for (std::int64_t slot = c.token_begin * p.top_k; slot < c.token_end * p.top_k; ++slot) {
          const std::int64_t row = p.combine_source_row[static_cast<std::size_t>(slot)];
          if (row >= 0) require_ordered(r, BufferId::CombineIn, row, c.col_begin, c.col_end, waited, me);
        }
      }
    });
  }

  void check_acyclic() {
    // nodes: tasks [0, task_total_), flags [task_total_, task_total_ + flag_total_)
    const std::int64_t nodes = task_total_ + flag_total_;
    std::vector<std::vector<std::int64_t>> next(static_cast<std::size_t>(nodes));
    std::vector<std::int64_t> indegree(static_cast<std::size_t>(nodes), 0);
    auto edge = [&](std::int64_t a, std::int64_t b) {
      next[static_cast<std::size_t>(a)].push_back(b);
      ++indegree[static_cast<std::size_t>(b)];
    };
    for (std::int64_t t = 0; t < task_total_; ++t) {
      const Raised& raised = raised_[static_cast<std::size_t>(t)];
      for (std::int64_t f = raised.first; f < raised.first + raised.count; ++f) edge(t, task_total_ + f);
    }
    for_each_task([&](int r, TaskRef ref, std::uint32_t begin, std::uint32_t count) {
      const StepPlan& p = plans_[static_cast<std::size_t>(r)];
      for (std::uint32_t i = begin; i < begin + count; ++i) edge(task_total_ + flag_id(r, p.waits[i].flag), task_id(r, ref));
      for_each_awaited_row(p, ref, [&](std::int64_t row) { edge(task_total_ + flag_id(r, p.row_arrival_flag) + row, task_id(r, ref)); });
    });
    for (int r = 0; r < world(); ++r) {
      const StepPlan& p = plans_[static_cast<std::size_t>(r)];
      for (const auto* queue : {&p.compute_queue, &p.comm_queue}) {
        for (std::size_t i = 1; i < queue->size(); ++i) edge(task_id(r, (*queue)[i - 1]), task_id(r, (*queue)[i]));
      }
    }
    std::vector<std::int64_t> ready;
    for (std::int64_t n = 0; n < nodes; ++n) {
      if (indegree[static_cast<std::size_t>(n)] == 0) ready.push_back(n);
    }
    std::int64_t done = 0;
    while (!ready.empty()) {
      const std::int64_t n = ready.back();
      ready.pop_back();
      ++done;
      for (std::int64_t m : next[static_cast<std::size_t>(n)]) {
        if (--indegree[static_cast<std::size_t>(m)] == 0) ready.push_back(m);
      }
    }
    if (done == nodes) return;
    for (std::int64_t t = 0; t < task_total_; ++t) {
      if (indegree[static_cast<std::size_t>(t)] > 0) {
        reject("the waits form a cycle (a deadlock whatever the timing): " + name(t) +
               " can never start; it waits, directly or through queue order, on tasks that wait on it");
      }
    }
    reject("the waits form a cycle");
  }
};

}  // namespace

void validate_plan(const std::vector<StepPlan>& plans) { PlanChecker(plans).run(); }

}  // namespace tilemoe
