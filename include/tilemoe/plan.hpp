#pragma once
// StepPlan: one MoE step of one rank, as flat tables of plain structs.
//
// Strategies (src/plan/*) decide; executors obey. A plan names
//  - seven row buffers per rank (see BufferId) and how many rows each needs;
//  - tasks of four kinds: GEMM0 tiles, GEMM1 tiles, segments (row copies, possibly to a peer)
//    and combine tasks (the top-k weighted sum of a token range and column range);
//  - for every task the flags it waits for (flag id, expected count, the rank that signals it)
//    and the flag it raises when done;
//  - two queues: the order in which compute workers and communication workers claim tasks.
// Workers of a class claim the tasks of their queue strictly in queue order and wait, bounded,
// for a task's flags before running it. validate_plan() proves a set of plans safe to run.
//
// Every table holds trivially copyable structs only, so a plan moves to a GPU as one byte
// blob (pack_plan) and kernels index it as arrays.
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "tilemoe/config.hpp"
#include "tilemoe/routing.hpp"
#include "tilemoe/strategy.hpp"
#include "tilemoe/strategy_options.hpp"

namespace tilemoe {

enum class BufferId : std::uint8_t {
  Input,       // [tokens, hidden]        this rank's tokens
  ExpertIn,    // [expert_rows, hidden]   GEMM0 input rows of the local experts (dispatch target)
  Activation,  // [expert_rows, ffn]      GEMM0 + activation output
  ExpertOut,   // [expert_rows, hidden]   GEMM1 output
  CombineIn,   // [combine_rows, hidden]  expert outputs of this rank's tokens (combine target)
  Output,      // [tokens, hidden]        the layer's output
  // [received_rows, hidden] the tokens other ranks sent this rank once each (a dispatch once per
  // destination rank), source block after source block, ascending; the receiver places them
  // into ExpertIn, a row for each of its local experts the token chose
  Received,
};
constexpr int kBufferCount = 7;
std::string_view buffer_name(BufferId buffer);

constexpr std::int32_t kNoFlag = -1;

struct FlagWait {
  std::uint32_t flag = 0;      // flag id on the waiting rank
  std::uint32_t expected = 0;  // wait until the flag's count reaches this
  std::int32_t from_rank = 0;  // the one rank that raises it (for error messages and checks)
};

struct RowRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

struct LocalExpert {
  std::int32_t global_id = 0;
  std::int64_t row_begin = 0;  // rows of ExpertIn / Activation / ExpertOut, padding included
  std::int64_t row_end = 0;
};

// One GEMM tile: rows [row_begin, row_end) x columns [col_begin, col_end) of the output.
// Layer 0 reads ExpertIn rows and writes Activation; layer 1 reads Activation, writes ExpertOut.
struct GemmTile {
  std::uint8_t layer = 0;
  std::int32_t expert = 0;  // local expert index
  std::int64_t row_begin = 0, row_end = 0;
  std::int64_t col_begin = 0, col_end = 0;
  std::uint32_t wait_begin = 0, wait_count = 0;  // into StepPlan::waits
  std::int32_t signal_flag = kNoFlag;            // local flag raised after the tile is stored
};

// A copy of `rows` rows x columns [col_begin, col_end) from a local buffer into `dst` of
// `dest_rank` (which may be this rank), landing at rows [dst_row, dst_row + rows).
// Source rows are [src_row, src_row + rows) or, when gather_count > 0, the rows listed at
// StepPlan::gather_rows[gather_begin ...]. After the data is visible the segment raises
// `dest_flag` on the destination rank (release); the reader acquires it. A segment whose
// `flag_per_row` is set raises a flag per row instead: dest_flag + i once row i has landed, so
// that a reader may take each row as it comes (into CombineIn: the rows' arrival flags, below).
struct Segment {
  BufferId src = BufferId::Input;
  BufferId dst = BufferId::ExpertIn;
  std::int32_t dest_rank = 0;
  std::int64_t rows = 0;
  std::int64_t src_row = 0;
  std::uint32_t gather_begin = 0, gather_count = 0;
  std::int64_t dst_row = 0;
  std::int64_t col_begin = 0, col_end = 0;
  std::uint32_t wait_begin = 0, wait_count = 0;
  std::int32_t dest_flag = kNoFlag;
  std::uint8_t flag_per_row = 0;
};

// Output[t][col_begin:col_end] = round(sum over slots j in order of
//   combine_weight[t*k+j] * CombineIn[combine_source_row[t*k+j]][cols]) for t in the range;
// a slot whose source row is -1 (dropped) contributes nothing.
// Besides its waits, a task whose `waits_for_rows` is set waits, for each slot of its tokens
// that reads CombineIn row x, for the row's arrival flag (StepPlan::row_arrival_flag + x, one
// signal): it combines as soon as its own rows have landed, whichever ranks and segments carry
// them. Which rows those are follows from the routing, so a counts-only compiler can name such
// waits only this way.
struct CombineTask {
  std::int64_t token_begin = 0, token_end = 0;
  std::int64_t col_begin = 0, col_end = 0;
  std::uint32_t wait_begin = 0, wait_count = 0;
  std::uint8_t waits_for_rows = 0;
};

enum class TaskKind : std::uint8_t { Gemm, Segment, Combine };
std::string_view task_kind_name(TaskKind kind);

struct TaskRef {
  TaskKind kind = TaskKind::Gemm;
  std::uint32_t index = 0;  // into tiles / segments / combines
};

struct StepPlan {
  Strategy strategy = Strategy::Sequential;
  std::int32_t rank = 0;
  std::int32_t world_size = 1;
  // the layer, as this rank runs it
  std::int64_t tokens = 0;
  std::int64_t hidden = 0;
  std::int64_t ffn_hidden = 0;
  std::int64_t top_k = 0;
  Activation activation = Activation::SwiGLU;
  DType dtype = DType::BF16;
  std::int32_t compute_workers = 1;  // how many workers of each class the executor starts
  std::int32_t comm_workers = 1;
  std::int64_t tile_m = 0, tile_n0 = 0, tile_n1 = 0;  // for reports; tiles carry their bounds

  std::int64_t expert_rows = 0;   // rows of ExpertIn / Activation / ExpertOut
  std::int64_t combine_rows = 0;  // rows of CombineIn
  std::int64_t received_rows = 0;  // rows of Received (0 when the dispatch sends a row per expert)
  std::uint32_t flag_count = 0;   // flags of this rank, ids [0, flag_count)
  // CombineIn row x's arrival flag is row_arrival_flag + x (combine tasks that wait for their
  // rows; segments that raise a flag per row); 0 when no task waits that way.
  std::uint32_t row_arrival_flag = 0;

  std::vector<LocalExpert> experts;
  std::vector<RowRange> zero_rows;  // ExpertIn padding rows, zeroed before the step
  std::vector<std::int64_t> gather_rows;
  std::vector<FlagWait> waits;
  std::vector<GemmTile> tiles;
  std::vector<Segment> segments;
  std::vector<CombineTask> combines;
  std::vector<std::int64_t> combine_source_row;  // [tokens * top_k], CombineIn row or -1
  std::vector<float> combine_weight;             // [tokens * top_k]
  // [expert_rows] when the router's weight scales the experts' input (RouterConfig::scales_input):
  // GEMM0 reads ExpertIn row x as round(row * expert_in_scale[x]) and combine_weight is 1; else empty.
  std::vector<float> expert_in_scale;
  std::vector<TaskRef> compute_queue;
  std::vector<TaskRef> comm_queue;

  std::int64_t buffer_rows(BufferId buffer) const;
  std::int64_t buffer_cols(BufferId buffer) const;
  std::size_t task_count() const { return tiles.size() + segments.size() + combines.size(); }
};

static_assert(std::is_trivially_copyable_v<FlagWait> && std::is_trivially_copyable_v<RowRange> &&
              std::is_trivially_copyable_v<LocalExpert> && std::is_trivially_copyable_v<GemmTile> &&
              std::is_trivially_copyable_v<Segment> && std::is_trivially_copyable_v<CombineTask> &&
              std::is_trivially_copyable_v<TaskRef>);

// The same plan with its room fixed in advance, the form a compiler fills on either side: on the
// GPU, a kernel writes a rank's plan every step into tables a layer sized when it was built
// (no allocation, no host synchronisation, so a captured step replays in a CUDA graph); on the
// host, the tables are vectors' storage. A table's `count` entries are in use.
template <typename T>
struct PlanTable {
  T* data = nullptr;
  std::uint32_t capacity = 0;
  std::uint32_t count = 0;
};

// What a compiler writes besides the tables (StepPlan's header, less what the layer fixes).
struct PlanHeader {
  std::int64_t expert_rows = 0;
  std::int64_t combine_rows = 0;
  std::int64_t received_rows = 0;
  std::uint32_t flag_count = 0;
  std::uint32_t row_arrival_flag = 0;  // as StepPlan's
  // The tiles table holds GEMM0's tiles [0, layer_tiles[0]), then GEMM1's: each GEMM's in the
  // order a GPU GEMM runs them (cluster mates adjacent), so that each GEMM walks its own range.
  std::uint32_t layer_tiles[2] = {0, 0};
  // 0, or 1 + the index of the first table that lacked room (see plan_table_name): the plan is
  // incomplete and must not run.
  std::uint32_t overflow = 0;
  // The step's expert rows exceed the buffers the layer sized (its receive room): the plan has
  // no tiles, so its GEMMs touch nothing, and the step is an error the exchange reports.
  std::uint32_t rows_exceed_room = 0;
};

// A rank's plan less its per-token tables (gather_rows, combine_source_row, combine_weight):
// those follow from the routing, and the rows they name are fixed by the counts alone (a
// rank's permuted order: global expert ascending, tokens ascending), so a compiler needs
// every rank's per-expert counts and nothing else.
struct PlanTables {
  PlanHeader header;
  PlanTable<LocalExpert> experts;
  PlanTable<FlagWait> waits;
  PlanTable<GemmTile> tiles;
  PlanTable<Segment> segments;
  PlanTable<CombineTask> combines;
  PlanTable<TaskRef> compute_queue;
  PlanTable<TaskRef> comm_queue;
};
constexpr int kPlanTableCount = 7;
// "experts", "waits", "tiles", "segments", "combines", "compute queue", "comm queue"
std::string_view plan_table_name(int index);

static_assert(std::is_trivially_copyable_v<PlanHeader> && std::is_trivially_copyable_v<PlanTables>);

// How the dispatch sends a token to the ranks of its experts. Outputs are bitwise the same
// either way: only the rows on the links and the copies at the receiver differ.
enum class DispatchVolume : std::uint8_t {
  // A row per (token, destination rank) into the destination's Received, with the token's
  // routing known to the destination's plan, which places it into ExpertIn once for each of its
  // local experts the token chose: DeepEP's volume. At top-k 8 over 256 experts on 8 ranks a
  // token reaches about 5.3 distinct ranks, so the dispatch moves about 2/3 of the rows; the
  // copies at the receiver are local.
  OncePerRank,
  // A row per (token, chosen expert) straight into the destination's ExpertIn (Megatron's
  // all-to-all dispatcher): no copy at the receiver, up to top_k rows of a token on a link.
  RowPerExpert,
};
std::string_view dispatch_volume_name(DispatchVolume volume);  // "once-per-rank", "row-per-expert"
DispatchVolume parse_dispatch_volume(std::string_view name);    // bad input naming both for anything else

struct PlanOptions {
  std::int64_t tile_m = 16;  // GEMM tile height (rows); tile_signal pads owner groups to it
  std::int64_t tile_n = 64;  // GEMM tile width (columns) for both layers
  std::int32_t compute_workers = 2;
  std::int32_t comm_workers = 1;
  TileSignalOptions tile_signal;     // bands_per_segment: mgb, row bands per middle segment
  CometOptions comet;
  std::int64_t combine_tokens = 32;   // tokens per combine task
  DispatchVolume dispatch = DispatchVolume::OncePerRank;
};
void validate(const PlanOptions& options, const EpWorld& world);

// The plans of every rank of one step. `routing[r]` is rank r's routing (its tokens'
// choices); plan compilation needs every rank's, as a real step has them after the count
// exchange.
std::vector<StepPlan> compile_plan(Strategy strategy, const EpWorld& world,
                                   const std::vector<Routing>& routing, const PlanOptions& options);

// Throws a bad-input Error saying what is wrong when the plans are not safe to run:
// an offset out of bounds, a region written twice or never, a wait without its signals,
// a read not ordered after its write, or a cycle of waits (a possible deadlock).
void validate_plan(const std::vector<StepPlan>& plans);

// One contiguous blob per plan (header + tables), the form a GPU executor copies in one memcpy.
std::vector<std::byte> pack_plan(const StepPlan& plan);
StepPlan unpack_plan(const std::vector<std::byte>& blob);

// The bytes a rank's plan puts on its links (segments to other ranks), by phase: the dispatch
// (into ExpertIn or Received) and the combine (into CombineIn).
struct LinkTraffic {
  std::int64_t dispatch_bytes = 0;
  std::int64_t combine_bytes = 0;
};
LinkTraffic link_traffic(const StepPlan& plan);

std::string describe_task(const StepPlan& plan, TaskRef task);
std::string plan_summary(const StepPlan& plan);

}  // namespace tilemoe
