#include "plan_builder.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <utility>

#include "tilemoe/error.hpp"

namespace tilemoe::plan_detail {

StepPlan empty_plan(Strategy strategy, const EpWorld& world, int rank, const PlanOptions& options) {
  StepPlan plan;
  plan.strategy = strategy;
  plan.rank = rank;
  plan.world_size = world.world_size();
  plan.tokens = world.tokens_per_rank[static_cast<std::size_t>(rank)];
  plan.hidden = world.layer.hidden;
  plan.ffn_hidden = world.layer.ffn_hidden;
  plan.top_k = world.layer.top_k;
  plan.activation = world.layer.activation;
  plan.dtype = world.layer.dtype;
  plan.compute_workers = options.compute_workers;
  plan.comm_workers = options.comm_workers;
  plan.tile_m = options.tile_m;
  plan.tile_n0 = options.tile_n;
  plan.tile_n1 = options.tile_n;
  return plan;
}

std::vector<StepPlan> empty_plans(Strategy strategy, const EpWorld& world, const PlanOptions& options) {
  std::vector<StepPlan> plans;
  for (int rank = 0; rank < world.world_size(); ++rank) plans.push_back(empty_plan(strategy, world, rank, options));
  return plans;
}

std::uint32_t new_flag(StepPlan& plan) { return plan.flag_count++; }

std::uint32_t append_waits(StepPlan& plan, const std::vector<FlagWait>& waits) {
  const auto begin = static_cast<std::uint32_t>(plan.waits.size());
  plan.waits.insert(plan.waits.end(), waits.begin(), waits.end());
  return begin;
}

std::uint32_t add_tile(StepPlan& plan, GemmTile tile, const std::vector<FlagWait>& waits) {
  tile.wait_begin = append_waits(plan, waits);
  tile.wait_count = static_cast<std::uint32_t>(waits.size());
  plan.tiles.push_back(tile);
  const auto index = static_cast<std::uint32_t>(plan.tiles.size() - 1);
  plan.compute_queue.push_back({TaskKind::Gemm, index});
  return index;
}

std::uint32_t add_segment(StepPlan& plan, Segment segment, const std::vector<FlagWait>& waits) {
  segment.wait_begin = append_waits(plan, waits);
  segment.wait_count = static_cast<std::uint32_t>(waits.size());
  plan.segments.push_back(segment);
  const auto index = static_cast<std::uint32_t>(plan.segments.size() - 1);
  plan.comm_queue.push_back({TaskKind::Segment, index});
  return index;
}

std::uint32_t add_combine(StepPlan& plan, CombineTask task, const std::vector<FlagWait>& waits) {
  task.wait_begin = append_waits(plan, waits);
  task.wait_count = static_cast<std::uint32_t>(waits.size());
  plan.combines.push_back(task);
  return static_cast<std::uint32_t>(plan.combines.size() - 1);
}

std::vector<RowRange> split_range(std::int64_t begin, std::int64_t end, std::int64_t width) {
  std::vector<RowRange> parts;
  for (std::int64_t at = begin; at < end; at += width) parts.push_back({at, std::min(end, at + width)});
  return parts;
}

int source_at(SourceOrder order, int rank, int world_size, int position) {
  switch (order) {
    case SourceOrder::Ascending:
      return position;
    case SourceOrder::RemoteFirst:
      return (rank + 1 + position) % world_size;
    case SourceOrder::LocalFirstRing:
      return (rank + position) % world_size;
  }
  throw_internal("unknown source order");
}

StepLayout build_layout(const EpWorld& world, const std::vector<Routing>& routing, SourceOrder order,
                        std::int64_t pad_rows) {
  const int world_size = world.world_size();
  const std::int64_t per_rank = world.experts_per_rank();
  const std::int64_t k = world.layer.top_k;
  StepLayout layout;
  layout.ranks.resize(static_cast<std::size_t>(world_size));

  // tokens_of[src][global expert] = the src rank's tokens routed (and kept) to that expert
  std::vector<std::vector<std::vector<std::int64_t>>> tokens_of(
      static_cast<std::size_t>(world_size),
      std::vector<std::vector<std::int64_t>>(static_cast<std::size_t>(world.layer.num_experts)));
  for (int src = 0; src < world_size; ++src) {
    const Routing& r = routing[static_cast<std::size_t>(src)];
    for (std::int64_t token = 0; token < r.tokens; ++token) {
      for (std::int64_t j = 0; j < k; ++j) {
        const std::size_t s = r.slot(token, j);
        if (r.kept[s]) tokens_of[src][static_cast<std::size_t>(r.expert[s])].push_back(token);
      }
    }
  }

  for (int rank = 0; rank < world_size; ++rank) {
    RankLayout& rl = layout.ranks[static_cast<std::size_t>(rank)];
    std::int64_t row = 0;
    for (std::int64_t le = 0; le < per_rank; ++le) {
      const auto global = static_cast<std::int32_t>(rank * per_rank + le);
      LocalExpert expert{global, row, row};
      for (int position = 0; position < world_size; ++position) {
        const int src = source_at(order, rank, world_size, position);
        const auto& tokens = tokens_of[static_cast<std::size_t>(src)][static_cast<std::size_t>(global)];
        if (tokens.empty()) continue;
        TokenGroup group;
        group.src_rank = src;
        group.local_expert = static_cast<std::int32_t>(le);
        group.row_begin = row;
        group.rows = static_cast<std::int64_t>(tokens.size());
        group.padded_rows = (group.rows + pad_rows - 1) / pad_rows * pad_rows;
        group.tokens = tokens;
        row += group.padded_rows;
        rl.groups.push_back(std::move(group));
      }
      expert.row_end = row;
      rl.experts.push_back(expert);
    }
    rl.expert_rows = row;
  }

  // CombineIn of each owner: regions by expert rank, then local expert.
  layout.combine_rows.assign(static_cast<std::size_t>(world_size), 0);
  layout.combine_source_row.resize(static_cast<std::size_t>(world_size));
  for (int owner = 0; owner < world_size; ++owner) {
    layout.combine_source_row[static_cast<std::size_t>(owner)].assign(
        static_cast<std::size_t>(world.tokens_per_rank[static_cast<std::size_t>(owner)] * k), -1);
  }
  // groups of one rank are expert-major (built expert by expert above), so visiting ranks,
  // then their groups in order, visits (rank, expert) regions in order for every owner
  for (int rank = 0; rank < world_size; ++rank) {
    for (TokenGroup& group : layout.ranks[static_cast<std::size_t>(rank)].groups) {
      const std::int64_t le = group.local_expert;
      const int owner = group.src_rank;
      std::int64_t& next = layout.combine_rows[static_cast<std::size_t>(owner)];
      group.combine_row = next;
      const Routing& r = routing[static_cast<std::size_t>(owner)];
      const auto global = static_cast<std::int32_t>(rank * per_rank + le);
      for (std::size_t i = 0; i < group.tokens.size(); ++i) {
        const std::int64_t token = group.tokens[i];
        for (std::int64_t j = 0; j < k; ++j) {
          const std::size_t s = r.slot(token, j);
          if (r.expert[s] == global) {
            layout.combine_source_row[static_cast<std::size_t>(owner)][s] =
                next + static_cast<std::int64_t>(i);
          }
        }
      }
      next += group.rows;
    }
  }
  return layout;
}

void apply_layout(std::vector<StepPlan>& plans, const StepLayout& layout,
                  const std::vector<Routing>& routing) {
  for (std::size_t rank = 0; rank < plans.size(); ++rank) {
    StepPlan& plan = plans[rank];
    const RankLayout& rl = layout.ranks[rank];
    plan.experts = rl.experts;
    plan.expert_rows = rl.expert_rows;
    plan.combine_rows = layout.combine_rows[rank];
    plan.combine_source_row = layout.combine_source_row[rank];
    plan.combine_weight = routing[rank].weight;
    for (const TokenGroup& group : rl.groups) {
      if (group.padded_rows > group.rows) {
        plan.zero_rows.push_back({group.row_begin + group.rows, group.row_begin + group.padded_rows});
      }
    }
  }
}

void add_dispatch(std::vector<StepPlan>& plans, const StepLayout& layout,
                  const std::function<int(int src, int step)>& dest_order,
                  const std::function<FlagWait(int dest, std::size_t group_index)>& arrival_flag) {
  const int world_size = static_cast<int>(plans.size());
  for (int src = 0; src < world_size; ++src) {
    StepPlan& plan = plans[static_cast<std::size_t>(src)];
    for (int step = 0; step < world_size; ++step) {
      const int dest = dest_order(src, step);
      const RankLayout& rl = layout.ranks[static_cast<std::size_t>(dest)];
      for (std::size_t g = 0; g < rl.groups.size(); ++g) {
        const TokenGroup& group = rl.groups[g];
        if (group.src_rank != src) continue;
        Segment segment;
        segment.src = BufferId::Input;
        segment.dst = BufferId::ExpertIn;
        segment.dest_rank = dest;
        segment.rows = group.rows;
        segment.gather_begin = static_cast<std::uint32_t>(plan.gather_rows.size());
        segment.gather_count = static_cast<std::uint32_t>(group.rows);
        plan.gather_rows.insert(plan.gather_rows.end(), group.tokens.begin(), group.tokens.end());
        segment.dst_row = group.row_begin;
        segment.col_begin = 0;
        segment.col_end = plan.hidden;
        segment.dest_flag = static_cast<std::int32_t>(arrival_flag(dest, g).flag);
        add_segment(plan, segment, {});
      }
    }
  }
}

void add_dispatch_once_per_rank(std::vector<StepPlan>& plans, const StepLayout& layout,
                                const std::function<int(int src, int step)>& dest_order,
                                const std::function<FlagWait(int dest, std::size_t group_index)>& arrival_flag) {
  const int world_size = static_cast<int>(plans.size());
  const auto at = [](auto& v, int i) -> auto& { return v[static_cast<std::size_t>(i)]; };
  // Received of each destination: source q's tokens for any of its groups, ascending, once each
  std::vector<std::vector<std::vector<std::int64_t>>> sent(static_cast<std::size_t>(world_size),
                                                           std::vector<std::vector<std::int64_t>>(static_cast<std::size_t>(world_size)));
  std::vector<std::vector<std::int64_t>> block(static_cast<std::size_t>(world_size), std::vector<std::int64_t>(static_cast<std::size_t>(world_size)));
  for (int dest = 0; dest < world_size; ++dest) {
    for (const TokenGroup& group : at(layout.ranks, dest).groups) {
      if (group.src_rank != dest) at(at(sent, dest), group.src_rank).insert(at(at(sent, dest), group.src_rank).end(), group.tokens.begin(), group.tokens.end());
    }
    std::int64_t rows = 0;
    for (int q = 0; q < world_size; ++q) {
      auto& tokens = at(at(sent, dest), q);
      std::sort(tokens.begin(), tokens.end());
      tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
      at(at(block, dest), q) = rows;
      rows += static_cast<std::int64_t>(tokens.size());
    }
    at(plans, dest).received_rows = rows;
  }
  auto gathered = [](StepPlan& plan, Segment& segment, const std::vector<std::int64_t>& rows) {
    segment.gather_begin = static_cast<std::uint32_t>(plan.gather_rows.size());
    segment.gather_count = static_cast<std::uint32_t>(rows.size());
    segment.rows = static_cast<std::int64_t>(rows.size());
    plan.gather_rows.insert(plan.gather_rows.end(), rows.begin(), rows.end());
  };
  // the sends, and the flag each raises at its destination
  std::vector<std::vector<FlagWait>> arrived(static_cast<std::size_t>(world_size), std::vector<FlagWait>(static_cast<std::size_t>(world_size)));
  std::vector<std::vector<int>> arrival_order(static_cast<std::size_t>(world_size));
  for (int src = 0; src < world_size; ++src) {
    StepPlan& plan = at(plans, src);
    for (int step = 0; step < world_size; ++step) {
      const int dest = dest_order(src, step);
      const RankLayout& rl = at(layout.ranks, dest);
      Segment segment;
      segment.src = BufferId::Input;
      segment.dest_rank = dest;
      segment.col_begin = 0;
      segment.col_end = plan.hidden;
      if (dest == src) {
        for (std::size_t g = 0; g < rl.groups.size(); ++g) {
          if (rl.groups[g].src_rank != src) continue;
          segment.dst = BufferId::ExpertIn;
          gathered(plan, segment, rl.groups[g].tokens);
          segment.dst_row = rl.groups[g].row_begin;
          segment.dest_flag = static_cast<std::int32_t>(arrival_flag(dest, g).flag);
          add_segment(plan, segment, {});
        }
        continue;
      }
      const std::vector<std::int64_t>& tokens = at(at(sent, dest), src);
      if (tokens.empty()) continue;
      segment.dst = BufferId::Received;
      gathered(plan, segment, tokens);
      segment.dst_row = at(at(block, dest), src);
      const std::uint32_t flag = new_flag(at(plans, dest));
      segment.dest_flag = static_cast<std::int32_t>(flag);
      at(at(arrived, dest), src) = FlagWait{flag, 1, src};
      add_segment(plan, segment, {});
    }
  }
  // each destination's placements, sources in the order their sends come (their step to it)
  for (int dest = 0; dest < world_size; ++dest) {
    std::vector<std::pair<int, int>> sources;  // (step, source)
    for (int src = 0; src < world_size; ++src) {
      if (src == dest || at(at(sent, dest), src).empty()) continue;
      for (int step = 0; step < world_size; ++step) {
        if (dest_order(src, step) == dest) sources.emplace_back(step, src);
      }
    }
    std::sort(sources.begin(), sources.end());
    StepPlan& plan = at(plans, dest);
    const RankLayout& rl = at(layout.ranks, dest);
    for (const auto& [step, src] : sources) {
      const std::vector<std::int64_t>& tokens = at(at(sent, dest), src);
      for (std::size_t g = 0; g < rl.groups.size(); ++g) {
        const TokenGroup& group = rl.groups[g];
        if (group.src_rank != src) continue;
        std::vector<std::int64_t> rows;  // each group token's row in Received
        for (std::int64_t token : group.tokens) {
          rows.push_back(at(at(block, dest), src) + (std::lower_bound(tokens.begin(), tokens.end(), token) - tokens.begin()));
        }
        Segment segment;
        segment.src = BufferId::Received;
        segment.dst = BufferId::ExpertIn;
        segment.dest_rank = dest;
        gathered(plan, segment, rows);
        segment.dst_row = group.row_begin;
        segment.col_begin = 0;
        segment.col_end = plan.hidden;
        segment.dest_flag = static_cast<std::int32_t>(arrival_flag(dest, g).flag);
        add_segment(plan, segment, {at(at(arrived, dest), src)});
      }
    }
  }
}

void add_alltoall_dispatch(std::vector<StepPlan>& plans, const StepLayout& layout) {
  const int world_size = static_cast<int>(plans.size());
  std::map<std::pair<int, int>, std::uint32_t> counter;  // (receiver, sender) -> flag
  add_dispatch(
      plans, layout, [&](int src, int step) { return (src + step) % world_size; },
      [&](int dest, std::size_t group) {
        const int src = layout.ranks[static_cast<std::size_t>(dest)].groups[group].src_rank;
        auto [it, added] = counter.try_emplace({dest, src}, 0u);
        if (added) it->second = new_flag(plans[static_cast<std::size_t>(dest)]);
        return FlagWait{it->second, 0, src};
      });
}

std::vector<FlagWait> all_arrivals(const std::vector<StepPlan>& plans, int receiver, BufferId buffer) {
  const ArrivalIndex arrivals = index_arrivals(plans, receiver, buffer);
  std::vector<std::int64_t> rows(arrivals.by_row.size());
  std::iota(rows.begin(), rows.end(), std::int64_t{0});
  return arrival_waits(arrivals, rows, 0, plans[static_cast<std::size_t>(receiver)].buffer_cols(buffer));
}

std::vector<RowRange> token_chunks(const StepPlan& plan, const PlanOptions& options) {
  return split_range(0, plan.tokens, options.combine_tokens);
}

ArrivalIndex index_arrivals(const std::vector<StepPlan>& plans, int receiver, BufferId buffer) {
  const StepPlan& target = plans[static_cast<std::size_t>(receiver)];
  ArrivalIndex index;
  index.by_row.resize(static_cast<std::size_t>(target.buffer_rows(buffer)));
  std::map<std::uint32_t, std::uint32_t> signals;  // flag -> how many segments raise it
  for (const StepPlan& plan : plans) {
    for (const Segment& segment : plan.segments) {
      if (segment.dest_rank == receiver && segment.dst == buffer && segment.dest_flag != kNoFlag) {
        ++signals[static_cast<std::uint32_t>(segment.dest_flag)];
      }
    }
  }
  for (const StepPlan& plan : plans) {
    for (const Segment& segment : plan.segments) {
      if (segment.dest_rank != receiver || segment.dst != buffer || segment.dest_flag == kNoFlag) continue;
      const auto flag = static_cast<std::uint32_t>(segment.dest_flag);
      const Arrival arrival{segment.col_begin, segment.col_end, FlagWait{flag, signals[flag], plan.rank}};
      for (std::int64_t row = segment.dst_row; row < segment.dst_row + segment.rows; ++row) {
        index.by_row[static_cast<std::size_t>(row)].push_back(arrival);
      }
    }
  }
  return index;
}

std::vector<FlagWait> arrival_waits(const ArrivalIndex& index, const std::vector<std::int64_t>& rows,
                                    std::int64_t col_begin, std::int64_t col_end) {
  std::set<std::uint32_t> seen;
  std::vector<FlagWait> waits;
  for (std::int64_t row : rows) {
    for (const Arrival& arrival : index.by_row[static_cast<std::size_t>(row)]) {
      if (arrival.col_end <= col_begin || arrival.col_begin >= col_end) continue;
      if (seen.insert(arrival.wait.flag).second) waits.push_back(arrival.wait);
    }
  }
  return waits;
}

std::vector<std::int64_t> combine_rows_of_tokens(const StepPlan& plan, RowRange tokens) {
  std::vector<std::int64_t> rows;
  for (std::int64_t s = tokens.begin * plan.top_k; s < tokens.end * plan.top_k; ++s) {
    const std::int64_t row = plan.combine_source_row[static_cast<std::size_t>(s)];
    if (row >= 0) rows.push_back(row);
  }
  return rows;
}

}  // namespace tilemoe::plan_detail
