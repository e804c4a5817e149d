#include <sstream>
#include <string>

#include "strategies.hpp"
#include "tilemoe/dtype.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/plan.hpp"

namespace tilemoe {

std::string_view strategy_name(Strategy strategy) {
  switch (strategy) {
    case Strategy::Sequential: return "sequential";
    case Strategy::TileSignal: return "tile_signal";
    case Strategy::Comet: return "comet";
    case Strategy::Auto: return "auto";
  }
  return "?";
}

Strategy parse_strategy(std::string_view name) {
  if (name == "sequential") return Strategy::Sequential;
  if (name == "tile_signal") return Strategy::TileSignal;
  if (name == "comet") return Strategy::Comet;
  if (name == "auto") return Strategy::Auto;
  throw_bad_input("unknown strategy '" + std::string(name) + "': use sequential, tile_signal, comet or auto");
}

std::string_view dispatch_volume_name(DispatchVolume volume) {
  switch (volume) {
    case DispatchVolume::OncePerRank: return "once-per-rank";
    case DispatchVolume::RowPerExpert: return "row-per-expert";
  }
  return "?";
}

DispatchVolume parse_dispatch_volume(std::string_view name) {
  if (name == "once-per-rank") return DispatchVolume::OncePerRank;
  if (name == "row-per-expert") return DispatchVolume::RowPerExpert;
  throw_bad_input("unknown dispatch '" + std::string(name) +
                  "': use once-per-rank (a row per token and destination rank) or row-per-expert (a row per token and chosen expert)");
}

void validate(const PlanOptions& options, const EpWorld& world) {
  auto positive = [](const char* what, std::int64_t value, std::int64_t limit) {
    if (value < 1 || value > limit) {
      throw_bad_input(std::string(what) + " = " + std::to_string(value) + " is outside [1, " +
                      std::to_string(limit) + "]");
    }
  };
  positive("tile_m", options.tile_m, 1 << 16);
  positive("tile_n", options.tile_n, 1 << 16);
  positive("compute workers", options.compute_workers, 256);
  positive("comm workers", options.comm_workers, 256);
  positive("combine_tokens", options.combine_tokens, 1 << 30);
  if (options.tile_signal.bands_per_segment < 0 || options.tile_signal.bands_per_segment > 8) {
    throw_bad_input("mgb = " + std::to_string(options.tile_signal.bands_per_segment) +
                    " is outside [0 (the strategy's choice), 8] (the paper uses 1 or 2)");
  }
  if (options.tile_signal.band_block < 0 || options.tile_signal.band_block % 2 != 0) {
    throw_bad_input("tile_signal band block = " + std::to_string(options.tile_signal.band_block) +
                    " bands: 0 (each expert's bands at once) or a positive even number");
  }
  if (options.dispatch != DispatchVolume::OncePerRank && options.dispatch != DispatchVolume::RowPerExpert) {
    throw_bad_input("unknown dispatch volume " + std::to_string(static_cast<int>(options.dispatch)));
  }
  if (options.comet.split_cols < 0 || options.comet.split_cols > world.layer.hidden) {
    throw_bad_input("comet split = " + std::to_string(options.comet.split_cols) +
                    " columns is outside [0 (auto), hidden = " + std::to_string(world.layer.hidden) + "]");
  }
}

std::vector<StepPlan> compile_plan(Strategy strategy, const EpWorld& world,
                                   const std::vector<Routing>& routing, const PlanOptions& options) {
  validate(world);
  validate(options, world);
  if (routing.size() != world.tokens_per_rank.size()) {
    throw_bad_input("routing is given for " + std::to_string(routing.size()) + " ranks, the world has " +
                    std::to_string(world.tokens_per_rank.size()));
  }
  for (std::size_t rank = 0; rank < routing.size(); ++rank) {
    const Routing& r = routing[rank];
    if (r.tokens != world.tokens_per_rank[rank] || r.top_k != world.layer.top_k ||
        r.expert.size() != static_cast<std::size_t>(r.tokens * r.top_k) ||
        r.weight.size() != r.expert.size() || r.kept.size() != r.expert.size()) {
      throw_bad_input("routing of rank " + std::to_string(rank) + " does not match its " +
                      std::to_string(world.tokens_per_rank[rank]) + " tokens x top_k " +
                      std::to_string(world.layer.top_k));
    }
    for (std::int32_t expert : r.expert) {
      if (expert < 0 || expert >= world.layer.num_experts) {
        throw_bad_input("routing of rank " + std::to_string(rank) + " names expert " +
                        std::to_string(expert) + ", outside [0, " + std::to_string(world.layer.num_experts) + ")");
      }
    }
  }
  switch (strategy) {
    case Strategy::Sequential: return plan_detail::compile_sequential(world, routing, options);
    case Strategy::TileSignal: return plan_detail::compile_tile_signal(world, routing, options);
    case Strategy::Comet: return plan_detail::compile_comet(world, routing, options);
    case Strategy::Auto:
      throw_bad_input("auto picks a strategy per GPU layer and compiles no plan itself: the CPU engine runs sequential, "
                      "tile_signal or comet");
  }
  throw_internal("unknown strategy");
}

std::string describe_task(const StepPlan& plan, TaskRef task) {
  std::ostringstream out;
  out << "rank " << plan.rank << " ";
  switch (task.kind) {
    case TaskKind::Gemm: {
      const GemmTile& t = plan.tiles.at(task.index);
      out << "gemm" << int(t.layer) << " tile " << task.index << " (expert "
          << (t.expert >= 0 && t.expert < static_cast<std::int32_t>(plan.experts.size())
                  ? plan.experts[static_cast<std::size_t>(t.expert)].global_id
                  : -1)
          << ", rows " << t.row_begin << ".." << t.row_end << ", cols " << t.col_begin << ".." << t.col_end << ")";
      break;
    }
    case TaskKind::Segment: {
      const Segment& s = plan.segments.at(task.index);
      out << "segment " << task.index << " (" << s.rows << " rows of " << buffer_name(s.src) << " to rank "
          << s.dest_rank << " " << buffer_name(s.dst) << " row " << s.dst_row << ", cols " << s.col_begin << ".."
          << s.col_end << ")";
      break;
    }
    case TaskKind::Combine: {
      const CombineTask& c = plan.combines.at(task.index);
      out << "combine " << task.index << " (tokens " << c.token_begin << ".." << c.token_end << ", cols "
          << c.col_begin << ".." << c.col_end << ")";
      break;
    }
  }
  return out.str();
}

LinkTraffic link_traffic(const StepPlan& plan) {
  LinkTraffic traffic;
  const auto element = static_cast<std::int64_t>(dtype_size(plan.dtype));
  for (const Segment& s : plan.segments) {
    if (s.dest_rank == plan.rank) continue;
    const std::int64_t bytes = s.rows * (s.col_end - s.col_begin) * element;
    (s.dst == BufferId::CombineIn ? traffic.combine_bytes : traffic.dispatch_bytes) += bytes;
  }
  return traffic;
}

std::string plan_summary(const StepPlan& plan) {
  std::ostringstream out;
  std::size_t remote_segments = 0;
  std::int64_t remote_rows = 0;
  for (const Segment& s : plan.segments) {
    if (s.dest_rank != plan.rank) {
      ++remote_segments;
      remote_rows += s.rows;
    }
  }
  std::int64_t padding = 0;
  for (const RowRange& r : plan.zero_rows) padding += r.end - r.begin;
  out << "rank " << plan.rank << ": " << strategy_name(plan.strategy) << ", " << plan.tokens << " tokens, "
      << plan.experts.size() << " local experts, " << plan.expert_rows << " expert rows (" << padding
      << " padding), " << plan.combine_rows << " combine rows; " << plan.tiles.size() << " tiles, "
      << plan.segments.size() << " segments (" << remote_segments << " remote, " << remote_rows
      << " rows), " << plan.combines.size() << " combine tasks, " << plan.flag_count << " flags, "
      << plan.waits.size() << " waits; queues: compute " << plan.compute_queue.size() << ", comm "
      << plan.comm_queue.size() << "; workers " << plan.compute_workers << " compute + " << plan.comm_workers
      << " comm";
  return out.str();
}

}  // namespace tilemoe
