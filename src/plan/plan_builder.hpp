#pragma once
// Small helpers every strategy uses to fill a StepPlan: allocate flags, append tasks with
// their waits, and the parts all strategies share (plan header, dispatch layout, combine).
#include <cstdint>
#include <functional>
#include <vector>

#include "tilemoe/plan.hpp"

namespace tilemoe::plan_detail {

// The plan of one rank with nothing scheduled yet, and those of every rank.
StepPlan empty_plan(Strategy strategy, const EpWorld& world, int rank, const PlanOptions& options);
std::vector<StepPlan> empty_plans(Strategy strategy, const EpWorld& world, const PlanOptions& options);

std::uint32_t new_flag(StepPlan& plan);
std::uint32_t append_waits(StepPlan& plan, const std::vector<FlagWait>& waits);
std::uint32_t add_tile(StepPlan& plan, GemmTile tile, const std::vector<FlagWait>& waits);
std::uint32_t add_segment(StepPlan& plan, Segment segment, const std::vector<FlagWait>& waits);
std::uint32_t add_combine(StepPlan& plan, CombineTask task, const std::vector<FlagWait>& waits);

// Column tiles [begin, end) of width `width` over [0, cols); the last one may be narrower.
std::vector<RowRange> split_range(std::int64_t begin, std::int64_t end, std::int64_t width);

// Where every routed token row sits during a step.
enum class SourceOrder {
  Ascending,       // sources 0, 1, ..., W-1 (the plain all-to-all layout)
  RemoteFirst,     // sources r+1, r+2, ..., r-1, then r itself (tile_signal)
  LocalFirstRing,  // r itself, then r+1, r+2, ... (comet)
};

// The rows of one (source rank, local expert) pair inside a rank's ExpertIn buffer.
struct TokenGroup {
  std::int32_t src_rank = 0;
  std::int32_t local_expert = 0;
  std::int64_t row_begin = 0;    // in the expert rank's ExpertIn
  std::int64_t rows = 0;         // real rows
  std::int64_t padded_rows = 0;  // rows rounded up to the padding unit
  std::int64_t combine_row = 0;  // where these rows land in the source rank's CombineIn
  std::vector<std::int64_t> tokens;  // token ids on the source rank, ascending
};

struct RankLayout {
  std::vector<LocalExpert> experts;
  std::vector<TokenGroup> groups;  // expert by expert, sources in the chosen order
  std::int64_t expert_rows = 0;
};

struct StepLayout {
  std::vector<RankLayout> ranks;
  std::vector<std::int64_t> combine_rows;                     // per owner rank
  std::vector<std::vector<std::int64_t>> combine_source_row;  // per owner, [tokens * top_k]
};

// Lays out every rank's expert rows (groups padded to `pad_rows`, 1 = no padding) and every
// owner's CombineIn (regions ordered by expert rank, then expert, tokens ascending).
StepLayout build_layout(const EpWorld& world, const std::vector<Routing>& routing, SourceOrder order,
                        std::int64_t pad_rows);

// The rank whose tokens are the `position`-th source group of rank `rank`'s experts.
int source_at(SourceOrder order, int rank, int world_size, int position);

// Dispatch: one segment per non-empty group, Input rows gathered on the source rank, put into
// the group's ExpertIn rows on the expert rank. `dest_order(src, step)` gives the dest rank
// of the src rank's step-th send; `arrival_flag(dest, group_index)` the flag the segment
// raises on the dest rank. Segments are appended to each source rank's comm queue.
void add_dispatch(std::vector<StepPlan>& plans, const StepLayout& layout,
                  const std::function<int(int src, int step)>& dest_order,
                  const std::function<FlagWait(int dest, std::size_t group_index)>& arrival_flag);

// The same dispatch once per destination rank (DispatchVolume::OncePerRank): a source sends each
// other rank, in `dest_order`, one segment with its tokens for any of that rank's groups, once
// each, into the rank's Received (a block per source, ascending), raising a flag of its own there;
// the rank places them, a local segment per group from Received into the group's ExpertIn rows,
// once that source's rows have arrived, sources in the order their rows arrive. A rank's own
// groups go straight into its ExpertIn. `arrival_flag(dest, group_index)` is the flag a group's
// rows raise on dest, as add_dispatch's.
void add_dispatch_once_per_rank(std::vector<StepPlan>& plans, const StepLayout& layout,
                                const std::function<int(int src, int step)>& dest_order,
                                const std::function<FlagWait(int dest, std::size_t group_index)>& arrival_flag);

// The plain all-to-all dispatch: rank p sends to p, p+1, ...; each receiver has one counter
// per sender, raised by every segment of that sender.
void add_alltoall_dispatch(std::vector<StepPlan>& plans, const StepLayout& layout);

// Copies the layout's tables (experts, padding, combine rows and weights) into the plans.
void apply_layout(std::vector<StepPlan>& plans, const StepLayout& layout,
                  const std::vector<Routing>& routing);

// Token chunks of `options.combine_tokens` over [0, tokens).
std::vector<RowRange> token_chunks(const StepPlan& plan, const PlanOptions& options);

// Which segment flags cover each row of one rank's buffer, so that a reader can wait for
// exactly the rows and columns it reads.
struct Arrival {
  std::int64_t col_begin = 0, col_end = 0;
  FlagWait wait;  // the flag on the receiving rank, with its full expected count
};
struct ArrivalIndex {
  std::vector<std::vector<Arrival>> by_row;
};
ArrivalIndex index_arrivals(const std::vector<StepPlan>& plans, int receiver, BufferId buffer);

// The waits (deduplicated) that cover rows `rows` x [col_begin, col_end) of the index.
std::vector<FlagWait> arrival_waits(const ArrivalIndex& index, const std::vector<std::int64_t>& rows,
                                    std::int64_t col_begin, std::int64_t col_end);

// The waits for every arrival into `buffer` of `receiver`: the end of an all-to-all.
std::vector<FlagWait> all_arrivals(const std::vector<StepPlan>& plans, int receiver, BufferId buffer);

// CombineIn rows read by the tokens [begin, end) of a plan (dropped slots skipped).
std::vector<std::int64_t> combine_rows_of_tokens(const StepPlan& plan, RowRange tokens);

}  // namespace tilemoe::plan_detail
