#include "plan_tables.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe {

std::string_view plan_table_name(int index) {
  switch (index) {
    case 0: return "experts";
    case 1: return "waits";
    case 2: return "tiles";
    case 3: return "segments";
    case 4: return "combines";
    case 5: return "compute queue";
    case 6: return "comm queue";
  }
  return "?";
}

namespace plan_detail {

PlanCapacity checked_capacity(const std::array<std::int64_t, kPlanTableCount>& entries) {
  PlanCapacity capacity;
  for (int i = 0; i < kPlanTableCount; ++i) {
    const std::int64_t n = entries[static_cast<std::size_t>(i)];
    // task indices are 32-bit, and a table of more than 2^31 entries is no plan a step can run
    if (n < 0 || n > std::numeric_limits<std::int32_t>::max()) {
      throw_bad_input("a plan would need " + std::to_string(n) + " entries of its " + std::string(plan_table_name(i)) +
                      " table, more than 2^31: use larger tiles or fewer tokens per step");
    }
    capacity.entries[static_cast<std::size_t>(i)] = static_cast<std::uint32_t>(n);
  }
  return capacity;
}

namespace {
template <typename T>
PlanTable<T> table_of(std::vector<T>& storage, std::uint32_t capacity) {
  storage.resize(capacity);
  return PlanTable<T>{storage.data(), capacity, 0};
}
template <typename T>
void copy_table(const PlanTable<T>& table, std::vector<T>& out) {
  out.assign(table.data, table.data + table.count);
}
}  // namespace

HostPlanTables::HostPlanTables(const PlanCapacity& capacity) {
  const auto& n = capacity.entries;
  view_.experts = table_of(experts_, n[kExpertsTable]);
  view_.waits = table_of(waits_, n[kWaitsTable]);
  view_.tiles = table_of(tiles_, n[kTilesTable]);
  view_.segments = table_of(segments_, n[kSegmentsTable]);
  view_.combines = table_of(combines_, n[kCombinesTable]);
  view_.compute_queue = table_of(compute_queue_, n[kComputeQueueTable]);
  view_.comm_queue = table_of(comm_queue_, n[kCommQueueTable]);
}

void copy_plan_tables(const PlanTables& tables, StepPlan& plan) {
  if (tables.header.overflow != 0) {
    throw_internal("the plan of rank " + std::to_string(plan.rank) + " overflowed its " +
                   std::string(plan_table_name(static_cast<int>(tables.header.overflow) - 1)) +
                   " table: the strategy's capacity is too small");
  }
  if (tables.header.rows_exceed_room != 0) {
    throw_internal("the plan of rank " + std::to_string(plan.rank) + " was compiled for a step whose expert rows exceed the "
                   "layer's receive room: that step failed and has no plan");
  }
  const std::uint32_t gemm0 = tables.header.layer_tiles[0];
  bool layered = gemm0 + tables.header.layer_tiles[1] == tables.tiles.count;
  for (std::uint32_t i = 0; layered && i < tables.tiles.count; ++i) layered = tables.tiles.data[i].layer == (i < gemm0 ? 0 : 1);
  if (!layered) {
    throw_internal("the plan of rank " + std::to_string(plan.rank) + " does not hold GEMM0's " + std::to_string(gemm0) +
                   " tiles and then GEMM1's " + std::to_string(tables.header.layer_tiles[1]) + " as its header says");
  }
  plan.expert_rows = tables.header.expert_rows;
  plan.combine_rows = tables.header.combine_rows;
  plan.received_rows = tables.header.received_rows;
  plan.flag_count = tables.header.flag_count;
  plan.row_arrival_flag = tables.header.row_arrival_flag;
  copy_table(tables.experts, plan.experts);
  copy_table(tables.waits, plan.waits);
  copy_table(tables.tiles, plan.tiles);
  copy_table(tables.segments, plan.segments);
  copy_table(tables.combines, plan.combines);
  copy_table(tables.compute_queue, plan.compute_queue);
  copy_table(tables.comm_queue, plan.comm_queue);
}

namespace {

// Field-wise equality (the structs have padding, which a device compiler leaves as it finds it).
struct FieldDiff {
  std::string out;
  template <typename T>
  void field(const char* name, const T& a, const T& b) {
    if (out.empty() && !(a == b)) out = std::string(name) + " " + std::to_string(+a) + " / " + std::to_string(+b);
  }
};
void fields(FieldDiff& d, const LocalExpert& a, const LocalExpert& b) {
  d.field("global_id", a.global_id, b.global_id);
  d.field("row_begin", a.row_begin, b.row_begin);
  d.field("row_end", a.row_end, b.row_end);
}
void fields(FieldDiff& d, const FlagWait& a, const FlagWait& b) {
  d.field("flag", a.flag, b.flag);
  d.field("expected", a.expected, b.expected);
  d.field("from_rank", a.from_rank, b.from_rank);
}
void fields(FieldDiff& d, const GemmTile& a, const GemmTile& b) {
  d.field("layer", a.layer, b.layer);
  d.field("expert", a.expert, b.expert);
  d.field("row_begin", a.row_begin, b.row_begin);
  d.field("row_end", a.row_end, b.row_end);
  d.field("col_begin", a.col_begin, b.col_begin);
  d.field("col_end", a.col_end, b.col_end);
  d.field("wait_begin", a.wait_begin, b.wait_begin);
  d.field("wait_count", a.wait_count, b.wait_count);
  d.field("signal_flag", a.signal_flag, b.signal_flag);
}
void fields(FieldDiff& d, const Segment& a, const Segment& b) {
  d.field("src", static_cast<int>(a.src), static_cast<int>(b.src));
  d.field("dst", static_cast<int>(a.dst), static_cast<int>(b.dst));
  d.field("dest_rank", a.dest_rank, b.dest_rank);
  d.field("rows", a.rows, b.rows);
  d.field("src_row", a.src_row, b.src_row);
  d.field("gather_begin", a.gather_begin, b.gather_begin);
  d.field("gather_count", a.gather_count, b.gather_count);
  d.field("dst_row", a.dst_row, b.dst_row);
  d.field("col_begin", a.col_begin, b.col_begin);
  d.field("col_end", a.col_end, b.col_end);
  d.field("wait_begin", a.wait_begin, b.wait_begin);
  d.field("wait_count", a.wait_count, b.wait_count);
  d.field("dest_flag", a.dest_flag, b.dest_flag);
  d.field("flag_per_row", a.flag_per_row, b.flag_per_row);
}
void fields(FieldDiff& d, const CombineTask& a, const CombineTask& b) {
  d.field("token_begin", a.token_begin, b.token_begin);
  d.field("token_end", a.token_end, b.token_end);
  d.field("col_begin", a.col_begin, b.col_begin);
  d.field("col_end", a.col_end, b.col_end);
  d.field("wait_begin", a.wait_begin, b.wait_begin);
  d.field("wait_count", a.wait_count, b.wait_count);
  d.field("waits_for_rows", a.waits_for_rows, b.waits_for_rows);
}
void fields(FieldDiff& d, const TaskRef& a, const TaskRef& b) {
  d.field("kind", static_cast<int>(a.kind), static_cast<int>(b.kind));
  d.field("index", a.index, b.index);
}
template <typename T>
std::string table_difference(const char* name, const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return std::string(name) + ": " + std::to_string(a.size()) + " / " + std::to_string(b.size()) + " entries";
  for (std::size_t i = 0; i < a.size(); ++i) {
    FieldDiff d;
    fields(d, a[i], b[i]);
    if (!d.out.empty()) return std::string(name) + "[" + std::to_string(i) + "]: " + d.out;
  }
  return "";
}

}  // namespace

std::string first_table_difference(const StepPlan& a, const StepPlan& b) {
  FieldDiff header;
  header.field("expert_rows", a.expert_rows, b.expert_rows);
  header.field("combine_rows", a.combine_rows, b.combine_rows);
  header.field("received_rows", a.received_rows, b.received_rows);
  header.field("flag_count", a.flag_count, b.flag_count);
  header.field("row_arrival_flag", a.row_arrival_flag, b.row_arrival_flag);
  if (!header.out.empty()) return "header: " + header.out;
  for (const std::string& d : {table_difference("experts", a.experts, b.experts), table_difference("waits", a.waits, b.waits),
                               table_difference("tiles", a.tiles, b.tiles), table_difference("segments", a.segments, b.segments),
                               table_difference("combines", a.combines, b.combines),
                               table_difference("compute queue", a.compute_queue, b.compute_queue),
                               table_difference("comm queue", a.comm_queue, b.comm_queue)}) {
    if (!d.empty()) return d;
  }
  return "";
}

HostStepCounts::HostStepCounts(std::vector<int> counts, int world, int experts, std::vector<int> rank_tokens, SendLists send_lists)
    : counts_(std::move(counts)), rank_tokens_(std::move(rank_tokens)), send_lists_(std::move(send_lists)) {
  if (world < 1 || experts < world || experts % world != 0 ||
      counts_.size() != static_cast<std::size_t>(world) * static_cast<std::size_t>(experts)) {
    throw_internal("step counts: " + std::to_string(counts_.size()) + " counts for " + std::to_string(world) + " ranks and " +
                   std::to_string(experts) + " experts");
  }
  const int local = experts / world;
  offset_.resize(static_cast<std::size_t>(world) * static_cast<std::size_t>(experts + 1));
  rank_row_.resize(static_cast<std::size_t>(world) * static_cast<std::size_t>(local + 1));
  derive_offsets(counts_.data(), world, experts, offset_.data());
  derive_rank_rows(offset_.data(), world, experts, rank_row_.data());
  if (!rank_tokens_.empty() && rank_tokens_.size() != static_cast<std::size_t>(world) * static_cast<std::size_t>(world)) {
    throw_internal("step counts: " + std::to_string(rank_tokens_.size()) + " rank token counts for " + std::to_string(world) + " ranks");
  }
  view_ = StepCounts{world, experts, local, offset_.data(), rank_row_.data(), rank_tokens_.empty() ? nullptr : rank_tokens_.data()};
}

SendLists rank_send_lists(const std::vector<Routing>& routing, int experts) {
  const auto world = static_cast<int>(routing.size());
  const int local = experts / world;
  SendLists lists(static_cast<std::size_t>(world), std::vector<std::vector<std::int64_t>>(static_cast<std::size_t>(world)));
  std::vector<std::int64_t> last_token(static_cast<std::size_t>(world));
  for (int q = 0; q < world; ++q) {
    const Routing& r = routing[static_cast<std::size_t>(q)];
    std::fill(last_token.begin(), last_token.end(), -1);
    for (std::int64_t token = 0; token < r.tokens; ++token) {
      for (std::int64_t j = 0; j < r.top_k; ++j) {
        const std::size_t s = r.slot(token, j);
        const int d = r.expert[s] / local;
        if (!r.kept[s] || d == q || last_token[static_cast<std::size_t>(d)] == token) continue;
        last_token[static_cast<std::size_t>(d)] = token;
        lists[static_cast<std::size_t>(q)][static_cast<std::size_t>(d)].push_back(token);
      }
    }
  }
  return lists;
}

HostStepCounts routing_counts(const std::vector<Routing>& routing, int experts) {
  const auto world = static_cast<int>(routing.size());
  std::vector<int> counts(static_cast<std::size_t>(world) * static_cast<std::size_t>(experts), 0);
  for (int q = 0; q < world; ++q) {
    const Routing& r = routing[static_cast<std::size_t>(q)];
    for (std::size_t s = 0; s < r.expert.size(); ++s) {
      if (r.kept[s]) ++counts[static_cast<std::size_t>(q) * static_cast<std::size_t>(experts) + static_cast<std::size_t>(r.expert[s])];
    }
  }
  SendLists lists = rank_send_lists(routing, experts);
  std::vector<int> rank_tokens(static_cast<std::size_t>(world) * static_cast<std::size_t>(world));
  for (int q = 0; q < world; ++q) {
    for (int d = 0; d < world; ++d) {
      rank_tokens[static_cast<std::size_t>(q * world + d)] = static_cast<int>(lists[static_cast<std::size_t>(q)][static_cast<std::size_t>(d)].size());
    }
  }
  return HostStepCounts(std::move(counts), world, experts, std::move(rank_tokens), std::move(lists));
}

namespace {

// Each ExpertIn row's input scale: the weight of the slot it holds (rows of (local expert e,
// source q) are q's tokens that chose e, ascending).
void add_input_scales(StepPlan& plan, const std::vector<Routing>& routing, const StepCounts& counts, DispatchOrder order) {
  const int rank = plan.rank, L = counts.local_experts;
  plan.expert_in_scale.assign(static_cast<std::size_t>(counts.expert_rows(rank)), 0.0f);
  for (int q = 0; q < counts.world; ++q) {
    const Routing& r = routing[static_cast<std::size_t>(q)];
    std::vector<std::int64_t> next(static_cast<std::size_t>(L));
    for (int e = 0; e < L; ++e) next[static_cast<std::size_t>(e)] = dispatch_block_row(counts, order, rank, e, q);
    for (std::int64_t token = 0; token < r.tokens; ++token) {
      for (std::int64_t j = 0; j < r.top_k; ++j) {
        const std::size_t s = r.slot(token, j);
        if (!r.kept[s] || r.expert[s] / L != rank) continue;
        plan.expert_in_scale[static_cast<std::size_t>(next[static_cast<std::size_t>(r.expert[s] % L)]++)] = r.weight[s];
      }
    }
  }
}

}  // namespace

void add_token_tables(StepPlan& plan, const std::vector<Routing>& routing, const HostStepCounts& host_counts, DispatchVolume dispatch,
                      DispatchOrder order, bool scales_input) {
  const StepCounts& counts = host_counts.view();
  const int rank = plan.rank, world = counts.world, L = counts.local_experts;
  const Routing& own = routing[static_cast<std::size_t>(rank)];
  std::vector<std::int64_t> next(static_cast<std::size_t>(counts.experts));
  for (int x = 0; x < counts.experts; ++x) next[static_cast<std::size_t>(x)] = counts.offset_of(rank, x);
  const bool once = dispatch == DispatchVolume::OncePerRank;
  plan.gather_rows.assign(static_cast<std::size_t>(once ? counts.placement_begin(rank) + counts.expert_rows(rank)
                                                        : counts.offset_of(rank, counts.experts)),
                          0);
  plan.combine_source_row.assign(own.expert.size(), -1);
  // tokens ascending inside each expert: visit tokens in order, a row for each kept choice
  for (std::int64_t token = 0; token < own.tokens; ++token) {
    for (std::int64_t j = 0; j < own.top_k; ++j) {
      const std::size_t s = own.slot(token, j);
      if (!own.kept[s]) continue;
      const std::int64_t row = next[static_cast<std::size_t>(own.expert[s])]++;
      plan.gather_rows[static_cast<std::size_t>(row)] = token;
      plan.combine_source_row[s] = row;
    }
  }
  plan.combine_weight = own.weight;
  if (scales_input) {
    std::fill(plan.combine_weight.begin(), plan.combine_weight.end(), 1.0f);
    add_input_scales(plan, routing, counts, order);
  } else {
    plan.expert_in_scale.clear();
  }
  if (!once) return;
  const SendLists& lists = host_counts.send_lists();
  if (lists.size() != static_cast<std::size_t>(world)) throw_internal("token tables: the step's counts carry no send lists");
  for (int d = 0; d < world; ++d) {
    const auto& list = lists[static_cast<std::size_t>(rank)][static_cast<std::size_t>(d)];
    std::copy(list.begin(), list.end(), plan.gather_rows.begin() + counts.send_list_row(rank, d));
  }
  // each other source's tokens, in the order they sit in this rank's Received, placed at the next
  // row of each local expert they chose (tokens ascending inside a (expert, source) block)
  const std::int64_t placement = counts.placement_begin(rank);
  for (int q = 0; q < world; ++q) {
    if (q == rank) continue;
    const Routing& r = routing[static_cast<std::size_t>(q)];
    const auto& list = lists[static_cast<std::size_t>(q)][static_cast<std::size_t>(rank)];
    std::vector<std::int64_t> block(static_cast<std::size_t>(L));
    for (int e = 0; e < L; ++e) block[static_cast<std::size_t>(e)] = dispatch_block_row(counts, order, rank, e, q);
    for (std::size_t i = 0; i < list.size(); ++i) {
      for (std::int64_t j = 0; j < r.top_k; ++j) {
        const std::size_t s = r.slot(list[i], j);
        if (!r.kept[s] || r.expert[s] / L != rank) continue;
        const std::int64_t row = block[static_cast<std::size_t>(r.expert[s] % L)]++;
        plan.gather_rows[static_cast<std::size_t>(placement + row)] = counts.received_row(rank, q) + static_cast<std::int64_t>(i);
      }
    }
  }
}

}  // namespace plan_detail
}  // namespace tilemoe
