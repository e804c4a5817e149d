#include "tilemoe/cpu_executor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "comm/cpu/shm_transport.hpp"
#include "core/expert_math.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/shared_expert.hpp"

namespace tilemoe {

namespace {

using Clock = std::chrono::steady_clock;

// The options' timeout as the transport's nanoseconds, refused before the conversion when it
// is out of range (milliseconds past about 9.2e12 overflow nanoseconds, and the transport then
// called the wrapped value "not positive").
std::chrono::nanoseconds wait_bound(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) throw_bad_input("the wait timeout must be at least 1 ms");
  if (timeout > cpu::kMaxWaitTimeout) {
    throw_bad_input("the wait timeout of " + std::to_string(timeout.count()) + " ms is more than a day (" +
                    std::to_string(std::chrono::milliseconds(cpu::kMaxWaitTimeout).count()) + " ms): use a shorter one");
  }
  return timeout;
}

class StepRunner {
 public:
  StepRunner(const std::vector<StepPlan>& plans, const ExpertWeights& weights, const std::vector<Matrix>& inputs,
             const CpuRunOptions& options)
      : plans_(plans), weights_(weights), inputs_(inputs), options_(options),
        transport_(static_cast<int>(plans.size()), wait_bound(options.timeout)), claims_(plans.size() * 2) {
    check_inputs(inputs);
    if (!std::isfinite(options.link_gbps) || options.link_gbps < 0.0) {
      throw_bad_input("the link rate must be 0 (unlimited) or positive and finite");
    }
    // A task delayed past the bound of every wait makes its waiters time out by construction.
    if (std::chrono::microseconds(options.max_delay_us) >= options.timeout) {
      throw_bad_input("a random delay of up to " + std::to_string(options.max_delay_us) + " us before each task is not shorter than " +
                      "the wait bound of " + std::to_string(options.timeout.count()) +
                      " ms, so waits would expire by design: lower --delay-us or raise --timeout-ms");
    }
    transport_.set_link_rate(options.link_gbps * 1e9);
    allocate(inputs);
    find_row_senders();
  }

  StepRun run() {
    const int world = static_cast<int>(plans_.size());
    struct WorkerSlot {
      int rank;
      WorkerClass cls;
      int index;
      std::vector<TaskRecord> records;
    };
    std::vector<WorkerSlot> slots;
    for (int r = 0; r < world; ++r) {
      const StepPlan& p = plans_[static_cast<std::size_t>(r)];
      for (int i = 0; i < p.compute_workers; ++i) slots.push_back({r, WorkerClass::Compute, i, {}});
      if (r == options_.silent_rank) continue;  // a stalled rank: its communication never runs
      for (int i = 0; i < p.comm_workers; ++i) slots.push_back({r, WorkerClass::Comm, i, {}});
    }
    states_ = std::vector<WorkerState>(slots.size());
    for (std::size_t i = 0; i < slots.size(); ++i) states_[i].rank = slots[i].rank;
    start_ = Clock::now();
    {
      std::vector<std::jthread> threads;
      threads.reserve(slots.size());
      for (std::size_t i = 0; i < slots.size(); ++i) {
        WorkerSlot& slot = slots[i];
        WorkerState& state = states_[i];
        threads.emplace_back([this, &slot, &state] { work(slot.rank, slot.cls, slot.index, slot.records, state); });
      }
    }
    const std::int64_t wall = elapsed_ns();
    if (first_error_) std::rethrow_exception(first_error_);

    StepRun result;
    result.wall_ns = wall;
    for (WorkerSlot& slot : slots) result.records.insert(result.records.end(), slot.records.begin(), slot.records.end());
    for (int r = 0; r < world; ++r) {
      const StepPlan& p = plans_[static_cast<std::size_t>(r)];
      Matrix out(p.dtype, p.tokens, p.hidden);
      if (!out.data.empty()) std::memcpy(out.data.data(), buffer(r, BufferId::Output), out.data.size());
      // The shared expert is the layer's arithmetic, not a schedule: no plan has a stage for it
      // yet, so it runs here, after the plan, on the rank's own tokens.
      if (weights_.shared) add_shared_expert(*weights_.shared, inputs_[static_cast<std::size_t>(r)], out);
      result.outputs.push_back(std::move(out));
    }
    return result;
  }

 private:
  const std::vector<StepPlan>& plans_;
  const ExpertWeights& weights_;
  const std::vector<Matrix>& inputs_;
  const CpuRunOptions& options_;
  cpu::ShmTransport transport_;
  int handle_[kBufferCount] = {};
  std::vector<std::atomic<std::size_t>> claims_;  // next queue position, per (rank, class)
  // What each worker is blocked on, so that a timeout can report every stalled wait and
  // name the peer they lead to, not just the first wait that happened to expire.
  struct WorkerState {
    int rank = 0;
    std::atomic<std::uint32_t> wait_index{kIdle};  // into the plan's waits, or kRowWait
    std::atomic<std::int64_t> row{0};              // the CombineIn row awaited, at kRowWait
    std::atomic<std::uint64_t> task{0};
  };
  static constexpr std::uint32_t kIdle = ~0u, kRowWait = ~0u - 1;
  // row_sender_[rank][row]: the rank whose segment raises CombineIn row's arrival flag (for the
  // waits of combine tasks on their rows, which name no rank of their own); -1 none
  std::vector<std::vector<int>> row_sender_;
  std::vector<WorkerState> states_;
  Clock::time_point start_;
  std::mutex error_mutex_;
  std::exception_ptr first_error_;

  std::int64_t elapsed_ns() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count();
  }

  std::size_t row_bytes(const StepPlan& p, BufferId b) const {
    return static_cast<std::size_t>(p.buffer_cols(b)) * dtype_size(p.dtype);
  }

  std::byte* buffer(int rank, BufferId b) { return transport_.peer_ptr(handle_[static_cast<int>(b)], rank); }

  void check_inputs(const std::vector<Matrix>& inputs) {
    if (inputs.size() != plans_.size()) {
      throw_bad_input("the step has " + std::to_string(plans_.size()) + " ranks but " + std::to_string(inputs.size()) + " inputs");
    }
    for (std::size_t r = 0; r < plans_.size(); ++r) {
      const StepPlan& p = plans_[r];
      const Matrix& in = inputs[r];
      if (in.dtype != p.dtype || in.rows != p.tokens || in.cols != p.hidden) {
        throw_bad_input("rank " + std::to_string(r) + ": input is " + std::to_string(in.rows) + " x " + std::to_string(in.cols) + " " +
                        std::string(dtype_name(in.dtype)) + ", the plan needs " + std::to_string(p.tokens) + " x " +
                        std::to_string(p.hidden) + " " + std::string(dtype_name(p.dtype)));
      }
    }
    if (weights_.hidden != plans_[0].hidden || weights_.ffn_hidden != plans_[0].ffn_hidden ||
        weights_.num_experts != static_cast<std::int64_t>(plans_[0].experts.size() * plans_.size()) ||
        weights_.activation != plans_[0].activation) {
      throw_bad_input("the expert weights do not match the plans' layer shape");
    }
  }

  void allocate(const std::vector<Matrix>& inputs) {
    for (int b = 0; b < kBufferCount; ++b) {
      std::size_t bytes = 0;
      for (const StepPlan& p : plans_) {
        bytes = std::max(bytes, static_cast<std::size_t>(p.buffer_rows(static_cast<BufferId>(b))) * row_bytes(p, static_cast<BufferId>(b)));
      }
      handle_[b] = transport_.alloc_symmetric(bytes);
    }
    for (int r = 0; r < static_cast<int>(plans_.size()); ++r) {
      const StepPlan& p = plans_[static_cast<std::size_t>(r)];
      transport_.resize_flags(r, p.flag_count);
      if (options_.poison) {
        for (int b = 0; b < kBufferCount; ++b) {
          // all-ones bytes are NaN in fp32 and bf16
          std::memset(buffer(r, static_cast<BufferId>(b)), 0xff, transport_.buffer_bytes(handle_[b]));
        }
      }
      const Matrix& in = inputs[static_cast<std::size_t>(r)];
      if (!in.data.empty()) std::memcpy(buffer(r, BufferId::Input), in.data.data(), in.data.size());
      for (const RowRange& z : p.zero_rows) {
        std::memset(buffer(r, BufferId::ExpertIn) + static_cast<std::size_t>(z.begin) * row_bytes(p, BufferId::ExpertIn), 0,
                    static_cast<std::size_t>(z.end - z.begin) * row_bytes(p, BufferId::ExpertIn));
      }
    }
  }

  void find_row_senders() {
    row_sender_.resize(plans_.size());
    for (std::size_t r = 0; r < plans_.size(); ++r) row_sender_[r].assign(static_cast<std::size_t>(plans_[r].combine_rows), -1);
    for (const StepPlan& p : plans_) {
      for (const Segment& s : p.segments) {
        if (s.flag_per_row == 0 || s.dst != BufferId::CombineIn) continue;
        const StepPlan& d = plans_[static_cast<std::size_t>(s.dest_rank)];
        for (std::int64_t i = 0; i < s.rows; ++i) {
          const std::int64_t row = s.dest_flag + i - static_cast<std::int64_t>(d.row_arrival_flag);
          if (row >= 0 && row < d.combine_rows) row_sender_[static_cast<std::size_t>(s.dest_rank)][static_cast<std::size_t>(row)] = p.rank;
        }
      }
    }
  }

  void fail(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (first_error_) return;
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      first_error_ = e.kind() == ErrorKind::Timeout ? std::make_exception_ptr(Error(ErrorKind::Timeout, stall_report())) : error;
    } catch (...) {
      first_error_ = error;
    }
    transport_.abort();
  }

  // Every wait blocked right now; the headline is a wait on another rank, the rank most
  // waited for: the stalled peer.
  std::string stall_report() {
    struct Blocked {
      int rank;
      TaskRef task;
      FlagWait wait;
    };
    std::vector<Blocked> blocked;
    std::map<int, int> blame;
    for (const WorkerState& state : states_) {
      const std::uint32_t w = state.wait_index.load(std::memory_order_acquire);
      if (w == kIdle) continue;
      const std::uint64_t packed = state.task.load(std::memory_order_acquire);
      const StepPlan& p = plans_[static_cast<std::size_t>(state.rank)];
      FlagWait wait;
      if (w == kRowWait) {  // a combine task's wait for one of its rows
        const std::int64_t row = state.row.load(std::memory_order_acquire);
        wait = FlagWait{p.row_arrival_flag + static_cast<std::uint32_t>(row), 1, sender_of(state.rank, row)};
      } else {
        wait = p.waits[w];
      }
      const Blocked b{state.rank, TaskRef{static_cast<TaskKind>(packed >> 32), static_cast<std::uint32_t>(packed)}, wait};
      blocked.push_back(b);
      if (b.wait.from_rank != b.rank) ++blame[b.wait.from_rank];
    }
    auto describe = [&](const Blocked& b) {
      const StepPlan& p = plans_[static_cast<std::size_t>(b.rank)];
      const std::string whom = b.wait.from_rank == b.rank ? "its own work" : "rank " + std::to_string(b.wait.from_rank);
      return "rank " + std::to_string(b.rank) + " waits for " + whom + " (flag " +
             std::to_string(b.wait.flag) + ": " + std::to_string(transport_.flag_value(b.rank, b.wait.flag)) + " of " +
             std::to_string(b.wait.expected) + " signals, before " + describe_task(p, b.task) + ")";
    };
    int suspect = -1, most = 0;
    for (auto [rank, count] : blame) {
      if (count > most) suspect = rank, most = count;
    }
    std::stable_partition(blocked.begin(), blocked.end(), [&](const Blocked& b) { return b.wait.from_rank == suspect && b.rank != suspect; });
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(options_.timeout).count();
    std::string report = "step timed out after " + std::to_string(ms) + " ms: ";
    if (blocked.empty()) return report + "no worker was blocked at that moment";
    report += describe(blocked.front());
    if (suspect >= 0) {
      report += "; rank " + std::to_string(suspect) + " is the peer most waited for (if it is merely slow: a large step, a slow "
                "--link-mbps or --delay-us, raise --timeout-ms)";
    } else {
      // Only waits of ranks on themselves: no peer stalled, a rank's own tasks were too slow
      // (a large step on a busy machine, a slow --link-mbps, --delay-us).
      report += "; no rank waits for another: rank " + std::to_string(blocked.front().rank) +
                "'s own work did not finish in time; if the step is just slow, raise --timeout-ms";
    }
    const std::size_t shown = std::min<std::size_t>(blocked.size(), 6);
    if (blocked.size() > 1) report += "; also blocked:";
    for (std::size_t i = 1; i < shown; ++i) report += " " + describe(blocked[i]) + ";";
    if (blocked.size() > shown) report += " and " + std::to_string(blocked.size() - shown) + " more";
    return report;
  }

  void work(int rank, WorkerClass cls, int index, std::vector<TaskRecord>& records, WorkerState& state) {
    const StepPlan& p = plans_[static_cast<std::size_t>(rank)];
    const auto& queue = cls == WorkerClass::Compute ? p.compute_queue : p.comm_queue;
    auto& claim = claims_[static_cast<std::size_t>(rank) * 2 + (cls == WorkerClass::Comm ? 1 : 0)];
    std::mt19937_64 rng(options_.delay_seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(rank) * 1009 +
                        static_cast<std::uint64_t>(cls) * 101 + static_cast<std::uint64_t>(index));
    std::uniform_int_distribution<std::uint32_t> delay(0, options_.max_delay_us);
    std::vector<float> scratch;
    try {
      for (;;) {
        if (transport_.aborted()) return;
        const std::size_t position = claim.fetch_add(1, std::memory_order_relaxed);
        if (position >= queue.size()) return;
        const TaskRef task = queue[position];
        if (options_.max_delay_us > 0) transport_.sleep_until(Clock::now() + std::chrono::microseconds(delay(rng)));
        wait_for(p, task, state);
        TaskRecord record{rank, cls, index, task, elapsed_ns(), 0};
        execute(p, task, scratch);
        record.end_ns = elapsed_ns();
        records.push_back(record);
        if (options_.tasks_done) options_.tasks_done->fetch_add(1, std::memory_order_relaxed);
      }
    } catch (const std::exception& error) {
      if (!cpu::is_abort_error(error)) fail(std::current_exception());
    } catch (...) {
      fail(std::current_exception());
    }
  }

  void wait_for(const StepPlan& p, TaskRef task, WorkerState& state) {
    std::uint32_t begin = 0, count = 0;
    switch (task.kind) {
      case TaskKind::Gemm: begin = p.tiles[task.index].wait_begin; count = p.tiles[task.index].wait_count; break;
      case TaskKind::Segment: begin = p.segments[task.index].wait_begin; count = p.segments[task.index].wait_count; break;
      case TaskKind::Combine: begin = p.combines[task.index].wait_begin; count = p.combines[task.index].wait_count; break;
    }
    state.task.store((static_cast<std::uint64_t>(task.kind) << 32) | task.index, std::memory_order_release);
    for (std::uint32_t i = begin; i < begin + count; ++i) {
      const FlagWait& w = p.waits[i];
      state.wait_index.store(i, std::memory_order_release);
      transport_.wait(p.rank, w.flag, w.expected, w.from_rank, [&] { return describe_task(p, task); });
    }
    if (task.kind == TaskKind::Combine && p.combines[task.index].waits_for_rows != 0) {
      const CombineTask& c = p.combines[task.index];
      for (std::int64_t slot = c.token_begin * p.top_k; slot < c.token_end * p.top_k; ++slot) {
        const std::int64_t row = p.combine_source_row[static_cast<std::size_t>(slot)];
        if (row < 0) continue;
        state.row.store(row, std::memory_order_relaxed);
        state.wait_index.store(kRowWait, std::memory_order_release);
        transport_.wait(p.rank, p.row_arrival_flag + static_cast<std::uint32_t>(row), 1, sender_of(p.rank, row),
                        [&] { return describe_task(p, task) + ", CombineIn row " + std::to_string(row); });
      }
    }
    state.wait_index.store(kIdle, std::memory_order_release);
  }

  int sender_of(int rank, std::int64_t row) const {
    const auto& senders = row_sender_[static_cast<std::size_t>(rank)];
    const int sender = row >= 0 && row < static_cast<std::int64_t>(senders.size()) ? senders[static_cast<std::size_t>(row)] : -1;
    return sender >= 0 ? sender : rank;
  }

  void execute(const StepPlan& p, TaskRef task, std::vector<float>& scratch) {
    switch (task.kind) {
      case TaskKind::Gemm: run_tile(p, p.tiles[task.index], scratch); break;
      case TaskKind::Segment: run_segment(p, p.segments[task.index]); break;
      case TaskKind::Combine: run_combine(p, p.combines[task.index], scratch); break;
    }
  }

  void run_tile(const StepPlan& p, const GemmTile& t, std::vector<float>& scratch) {
    const BufferId in = t.layer == 0 ? BufferId::ExpertIn : BufferId::Activation;
    const BufferId out = t.layer == 0 ? BufferId::Activation : BufferId::ExpertOut;
    const std::int64_t depth = p.buffer_cols(in), width = t.col_end - t.col_begin, rows = t.row_end - t.row_begin;
    if (rows == 0) return;  // a cluster mate's padding: nothing to compute
    scratch.resize(static_cast<std::size_t>(rows * (depth + width)));
    float* a = scratch.data();
    float* c = a + rows * depth;
    const std::byte* src = buffer(p.rank, in) + static_cast<std::size_t>(t.row_begin) * row_bytes(p, in);
    load_row(p.dtype, src, static_cast<std::size_t>(rows * depth), a);
    if (t.layer == 0 && !p.expert_in_scale.empty()) {  // the router's weight scales the input (Llama-4)
      for (std::int64_t i = 0; i < rows; ++i) {
        const float scale = p.expert_in_scale[static_cast<std::size_t>(t.row_begin + i)];
        for (std::int64_t k = 0; k < depth; ++k) a[i * depth + k] = round_to(p.dtype, a[i * depth + k] * scale);
      }
    }
    const std::int64_t expert = p.experts[static_cast<std::size_t>(t.expert)].global_id;
    if (t.layer == 0) {
      math::gemm0_rows(weights_, expert, a, rows, t.col_begin, t.col_end, c);
    } else {
      math::gemm1_rows(weights_, expert, a, rows, t.col_begin, t.col_end, c);
    }
    const std::size_t elem = dtype_size(p.dtype);
    for (std::int64_t i = 0; i < rows; ++i) {
      std::byte* dst = buffer(p.rank, out) + static_cast<std::size_t>(t.row_begin + i) * row_bytes(p, out) +
                       static_cast<std::size_t>(t.col_begin) * elem;
      store_row(p.dtype, c + i * width, static_cast<std::size_t>(width), dst);
    }
    if (t.signal_flag != kNoFlag) transport_.signal(p.rank, static_cast<std::uint32_t>(t.signal_flag));
  }

  void run_segment(const StepPlan& p, const Segment& s) {
    const std::size_t elem = dtype_size(p.dtype);
    const std::size_t src_row_bytes = row_bytes(p, s.src);
    const std::size_t dst_row_bytes = row_bytes(plans_[static_cast<std::size_t>(s.dest_rank)], s.dst);
    const std::size_t bytes = static_cast<std::size_t>(s.col_end - s.col_begin) * elem;
    const std::size_t col_offset = static_cast<std::size_t>(s.col_begin) * elem;
    const std::byte* src = buffer(p.rank, s.src);
    for (std::int64_t i = 0; i < s.rows; ++i) {
      const std::int64_t row = s.gather_count > 0 ? p.gather_rows[s.gather_begin + static_cast<std::size_t>(i)] : s.src_row + i;
      transport_.put(p.rank, s.dest_rank, handle_[static_cast<int>(s.dst)],
                     static_cast<std::size_t>(s.dst_row + i) * dst_row_bytes + col_offset,
                     src + static_cast<std::size_t>(row) * src_row_bytes + col_offset, bytes);
      if (s.flag_per_row != 0) transport_.signal(s.dest_rank, static_cast<std::uint32_t>(s.dest_flag + i));
    }
    if (s.dest_flag != kNoFlag && s.flag_per_row == 0) transport_.signal(s.dest_rank, static_cast<std::uint32_t>(s.dest_flag));
  }

  void run_combine(const StepPlan& p, const CombineTask& c, std::vector<float>& scratch) {
    const std::int64_t width = c.col_end - c.col_begin;
    scratch.resize(static_cast<std::size_t>(2 * width));
    float* acc = scratch.data();
    float* y = acc + width;
    const std::size_t elem = dtype_size(p.dtype);
    const std::byte* combine_in = buffer(p.rank, BufferId::CombineIn);
    for (std::int64_t t = c.token_begin; t < c.token_end; ++t) {
      std::fill(acc, acc + width, 0.0f);
      for (std::int64_t j = 0; j < p.top_k; ++j) {
        const auto slot = static_cast<std::size_t>(t * p.top_k + j);
        const std::int64_t row = p.combine_source_row[slot];
        if (row < 0) continue;
        load_row(p.dtype, combine_in + static_cast<std::size_t>(row) * row_bytes(p, BufferId::CombineIn) + static_cast<std::size_t>(c.col_begin) * elem,
                 static_cast<std::size_t>(width), y);
        math::accumulate_slot(p.combine_weight[slot], y, width, acc);
      }
      store_row(p.dtype, acc, static_cast<std::size_t>(width),
                buffer(p.rank, BufferId::Output) + static_cast<std::size_t>(t) * row_bytes(p, BufferId::Output) +
                    static_cast<std::size_t>(c.col_begin) * elem);
    }
  }
};

}  // namespace

StepRun run_step(const std::vector<StepPlan>& plans, const ExpertWeights& weights, const std::vector<Matrix>& inputs,
                 const CpuRunOptions& options) {
  if (plans.empty()) throw_bad_input("a step needs at least one plan");
  StepRunner runner(plans, weights, inputs, options);
  return runner.run();
}

}  // namespace tilemoe
