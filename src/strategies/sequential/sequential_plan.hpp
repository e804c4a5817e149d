#pragma once
// The sequential strategy's compiler: one code path from every rank's per-expert counts to one
// rank's plan, run by the host (compile_plan) and by a kernel on the GPU (device_compiler.cu).
//
// The schedule: the dispatch all-to-all (rank r sends to r, r + 1, ...), every local expert's
// GEMM0 tiles, then every GEMM1 tile (in the planned GEMM's order, which the GPU's GEMMs walk),
// the combine all-to-all (a segment per (local expert, source) group, back to the source), then
// the top-k sums in token chunks. Each phase waits for the whole phase before it.
// The dispatch (SequentialShape::dispatch):
//  - RowPerExpert: a segment per (destination, local expert) group, empty groups included,
//    straight into the destination's ExpertIn;
//  - OncePerRank: r's own rows into its ExpertIn as above; a segment per other rank d with r's
//    tokens for any of d's experts, once each, into d's Received; then r places what each other
//    rank q sent it: a local segment per (q, local expert) from Received into ExpertIn, after
//    q's rows have arrived, q = r - 1, r - 2, ... (the order they arrive in).
//
// Flags of rank r, numbered so that any rank can name a peer's: [0, W) the rows from source q are
// in ExpertIn (RowPerExpert: q's arrivals, raised by q; OncePerRank: raised by r's own segments,
// its dispatch for q = r and its placements of q's rows otherwise), W the GEMM0 tiles, W + 1 the
// GEMM1 tiles, [W + 2, 2W + 2) the combine arrivals from expert rank d; OncePerRank adds
// [2W + 2, 3W + 2), q's rows have arrived in Received. A segment raises its flag even when its
// group is empty, so each flag of [0, W) expects L signals and each of Received's one, whatever
// the routing.
//
// Every entry of every table is a function of its index and a few prefix sums over the local
// experts (sequential_prefix), so the GPU writes them a thread per entry: the prefix sums first
// (the host serially, the device a warp-wide scan each), then compile_sequential_tables.
#include <cstdint>

#include "plan/plan_tables.hpp"
#include "plan/step_counts.hpp"
#include "plan/tile_table.hpp"

namespace tilemoe::plan_detail {

struct SequentialShape {
  int rank = 0;
  std::int64_t tokens = 0;  // this rank's
  std::int64_t hidden = 0;
  std::int64_t ffn_hidden = 0;
  std::int64_t tile_m = 16;
  std::int64_t tile_n[2] = {64, 64};  // output columns per tile of GEMM0 (Activation) and GEMM1
  // The GEMM tiles' order (plan/tile_table.hpp): the GPU's, cluster mates adjacent and padding
  // mates (tiles of no rows) where a group's tiles do not pair up; None on the CPU engine.
  cuda::PlannedCluster cluster = cuda::PlannedCluster::None;
  int band_block[2] = {0, 0};  // > 0: each expert's tiles in blocks of that many row bands
  std::int64_t combine_tokens = 32;
  // The most expert rows the rank's buffers hold (0: no bound, the host's plans). A step of more
  // (counts a failing exchange left behind) compiles to a plan without tiles, marked
  // PlanHeader::rows_exceed_room, so that no GEMM writes past the buffers.
  std::int64_t receive_rows = 0;
  // OncePerRank needs StepCounts::rank_tokens. (The GPU's exchange runs RowPerExpert only.)
  DispatchVolume dispatch = DispatchVolume::RowPerExpert;
};

TILEMOE_HOST_DEVICE inline bool once_per_rank(const SequentialShape& s) { return s.dispatch == DispatchVolume::OncePerRank; }

TILEMOE_HOST_DEVICE inline std::uint32_t sequential_flag_count(int world, DispatchVolume dispatch) {
  return static_cast<std::uint32_t>(dispatch == DispatchVolume::OncePerRank ? 3 * world + 2 : 2 * world + 2);
}
// OncePerRank: the flag of rank d that source q's Received rows raise (sequential's; tile_signal
// has its own, after its row arrivals).
TILEMOE_HOST_DEVICE inline std::uint32_t sequential_received_flag(int world, int q) { return static_cast<std::uint32_t>(2 * world + 2 + q); }

// The plan's first segments are the dispatch (tile_signal's too): [0, W L) with RowPerExpert;
// with OncePerRank [0, L) the own rows, [L, L + W - 1) the sends, then (W - 1) L placements.
TILEMOE_HOST_DEVICE inline int dispatch_segment_count(int world, int local_experts, DispatchVolume dispatch) {
  return dispatch == DispatchVolume::OncePerRank ? local_experts + (world - 1) * (local_experts + 1) : world * local_experts;
}
// The waits the dispatch adds after a strategy's own: with OncePerRank, one per placed source
// (q = r - 1 - i for wait i), the arrival of its Received rows.
TILEMOE_HOST_DEVICE inline int received_wait_count(int world, DispatchVolume dispatch) {
  return dispatch == DispatchVolume::OncePerRank ? world - 1 : 0;
}

TILEMOE_HOST_DEVICE inline int sequential_column_tiles(const SequentialShape& s, int layer) {
  return static_cast<int>(ceil_div64(layer == 0 ? s.ffn_hidden : s.hidden, s.tile_n[layer]));
}

// Room for any step of a layer whose ranks receive at most `max_rows` expert rows and own at most
// `max_tokens` tokens: per layer, (max_rows / tile_m + 2 per expert) bands (a partial band, and
// a pair's padding band on 2x1 clusters) x (column tiles + 1) (a pair's padding column on 1x2).
inline PlanCapacity sequential_capacity(int world, int local_experts, std::int64_t max_rows, std::int64_t max_tokens,
                                        const SequentialShape& shape) {
  const std::int64_t bands = max_rows / shape.tile_m + 2LL * local_experts;
  const std::int64_t tiles = bands * (sequential_column_tiles(shape, 0) + 1 + sequential_column_tiles(shape, 1) + 1);
  const std::int64_t combines = ceil_div64(max_tokens, shape.combine_tokens);
  const std::int64_t segments = dispatch_segment_count(world, local_experts, shape.dispatch) + 1LL * world * local_experts;
  const std::int64_t waits = 2LL * world + 2 + received_wait_count(world, shape.dispatch);
  return checked_capacity({local_experts, waits, tiles, segments, combines, tiles + combines, segments});
}

// The prefix sums the tables are indexed by: for GEMM layer l, `tile_first[l * (L + 2) + e]` is
// the first entry of local expert e's tiles in that GEMM's range (e = L: the GEMM's entries),
// and `tile_first[l * (L + 2) + L + 1]` the GEMM's tiles that compute rows (padding mates
// excluded), which its flag counts. Room: sequential_prefix_size(L).
TILEMOE_HOST_DEVICE inline int sequential_prefix_size(int local_experts) { return 2 * (local_experts + 2); }

// Expert e's tiles in GEMM `layer` of rank s.rank.
TILEMOE_HOST_DEVICE inline cuda::GroupTiles sequential_expert_tiles(const StepCounts& c, const SequentialShape& s, int layer, int e) {
  return cuda::group_tiles(c.local_rows(s.rank, e), sequential_column_tiles(s, layer), s.cluster, static_cast<int>(s.tile_m));
}

// The prefix sums on one thread (the host's way; the device scans with a warp per GEMM).
inline void sequential_prefix(const StepCounts& c, const SequentialShape& s, int* tile_first) {
  const int L = c.local_experts;
  for (int layer = 0; layer < 2; ++layer) {
    int* first = tile_first + layer * (L + 2);
    int entries = 0, real = 0;
    for (int e = 0; e < L; ++e) {
      const cuda::GroupTiles g = sequential_expert_tiles(c, s, layer, e);
      first[e] = entries;
      entries += g.entries;
      real += g.m_tiles * sequential_column_tiles(s, layer);
    }
    first[L] = entries;
    first[L + 1] = real;
  }
}

// Where each phase's waits sit, from the prefix sums (O(1) per thread): [0, W) one per source,
// then GEMM0's and GEMM1's if they have tiles, then [combine_wait_begin, + W) one per expert rank,
// then (OncePerRank) [received_wait_begin, + W - 1) one per placed source.
struct SequentialSummary {
  std::int64_t layer_tiles[2] = {0, 0};  // entries of each GEMM, padding mates included
  std::int64_t real_tiles[2] = {0, 0};   // those that compute rows (and raise the GEMM's flag)
  std::uint32_t layer_wait[2] = {0, 0};  // the wait for all of GEMM0 / GEMM1 (if it has tiles)
  std::uint32_t combine_wait_begin = 0;
  std::uint32_t received_wait_begin = 0;
  std::uint32_t waits = 0;
};

TILEMOE_HOST_DEVICE inline SequentialSummary summarize_sequential(const StepCounts& c, const SequentialShape& s, const int* tile_first) {
  const int W = c.world, L = c.local_experts;
  SequentialSummary m;
  std::uint32_t at = static_cast<std::uint32_t>(W);
  for (int layer = 0; layer < 2; ++layer) {
    m.layer_tiles[layer] = tile_first[layer * (L + 2) + L];
    m.real_tiles[layer] = tile_first[layer * (L + 2) + L + 1];
    m.layer_wait[layer] = at;
    at += m.real_tiles[layer] > 0 ? 1u : 0u;
  }
  m.combine_wait_begin = at;
  m.received_wait_begin = at + static_cast<std::uint32_t>(W);
  m.waits = m.received_wait_begin + static_cast<std::uint32_t>(received_wait_count(W, s.dispatch));
  return m;
}

// GEMM tile `i` of the plan: GEMM0's tiles, then GEMM1's, each GEMM's in the order the planned
// GEMM runs them (the sequential table of plan/tile_table.hpp, one decode for both sides).
// GEMM0 waits for the whole dispatch, GEMM1 for all of GEMM0; a padding mate (no rows) computes
// nothing and raises nothing.
TILEMOE_HOST_DEVICE inline GemmTile sequential_tile(const StepCounts& c, const SequentialShape& s, const SequentialSummary& m,
                                                    const int* tile_first, std::int64_t i) {
  const int W = c.world, L = c.local_experts, r = s.rank;
  const int layer = i < m.layer_tiles[0] ? 0 : 1;
  const int index = static_cast<int>(layer == 0 ? i : i - m.layer_tiles[0]);
  const int* first = tile_first + layer * (L + 2);
  // the expert holding entry `index`: the last e with first[e] <= index (empty experts share
  // their successor's first entry, so the search takes the last of equal ones)
  int lo = 0, hi = L - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first[mid] <= index) lo = mid; else hi = mid - 1;
  }
  const int e = lo;
  const cuda::GemmTileEntry entry =
      cuda::decode_entry(e, c.expert_row(r, e), c.local_rows(r, e), 0, index - first[e], index, sequential_column_tiles(s, layer),
                         s.cluster, cuda::TileFlags::None, s.band_block[layer], static_cast<int>(s.tile_m));
  const std::int64_t cols = layer == 0 ? s.ffn_hidden : s.hidden;
  const std::int64_t col = static_cast<std::int64_t>(entry.col_tile) * s.tile_n[layer];
  GemmTile tile;
  tile.layer = static_cast<std::uint8_t>(layer);
  tile.expert = e;
  tile.row_begin = entry.row_begin;
  tile.row_end = entry.row_begin + entry.rows;
  tile.col_begin = col;
  tile.col_end = col + s.tile_n[layer] < cols ? col + s.tile_n[layer] : cols;
  tile.signal_flag = entry.rows > 0 ? W + layer : kNoFlag;
  tile.wait_begin = layer == 0 ? 0u : m.layer_wait[0];
  tile.wait_count = layer == 0 ? static_cast<std::uint32_t>(W) : 1u;
  return tile;
}

// Dispatch segment `j` (see dispatch_segment_count): `received_flag(d, q)` is rank d's flag that
// source q's Received rows raise, `received_wait_begin` where this rank's waits for them start
// (both OncePerRank only: each strategy numbers its own).
template <typename ReceivedFlag>
TILEMOE_HOST_DEVICE inline Segment dispatch_segment(const StepCounts& c, const SequentialShape& s, DispatchOrder order, int j,
                                                    ReceivedFlag received_flag, std::uint32_t received_wait_begin) {
  const int W = c.world, L = c.local_experts, r = s.rank;
  Segment segment;
  segment.col_begin = 0;
  segment.col_end = s.hidden;
  const bool once = once_per_rank(s);
  if (!once || j < L) {  // this rank's permuted rows of (destination d, its local expert e)
    const int d = dispatch_destination(order, r, j / L, W), e = j % L;
    segment.src = BufferId::Input;
    segment.dst = BufferId::ExpertIn;
    segment.dest_rank = d;
    segment.rows = c.count(r, d * L + e);
    segment.gather_begin = static_cast<std::uint32_t>(c.offset_of(r, d * L + e));
    segment.gather_count = static_cast<std::uint32_t>(segment.rows);
    segment.dst_row = dispatch_block_row(c, order, d, e, r);
    segment.dest_flag = r;
    return segment;
  }
  if (j < L + W - 1) {  // this rank's tokens for any expert of d, once each, into d's Received
    const int d = dispatch_destination(order, r, 1 + (j - L), W);
    segment.src = BufferId::Input;
    segment.dst = BufferId::Received;
    segment.dest_rank = d;
    segment.rows = c.tokens_to(r, d);
    segment.gather_begin = static_cast<std::uint32_t>(c.send_list_row(r, d));
    segment.gather_count = static_cast<std::uint32_t>(segment.rows);
    segment.dst_row = c.received_row(d, r);
    segment.dest_flag = static_cast<std::int32_t>(received_flag(d, r));
    return segment;
  }
  // source q's rows of local expert e, placed from Received once q's rows are in
  const int i = (j - L - (W - 1)) / L, e = (j - L - (W - 1)) % L, q = dispatch_arrival(order, r, 1 + i, W);
  segment.src = BufferId::Received;
  segment.dst = BufferId::ExpertIn;
  segment.dest_rank = r;
  segment.rows = c.count(q, r * L + e);
  segment.dst_row = dispatch_block_row(c, order, r, e, q);
  segment.gather_begin = static_cast<std::uint32_t>(c.placement_begin(r) + segment.dst_row);
  segment.gather_count = static_cast<std::uint32_t>(segment.rows);
  segment.wait_begin = received_wait_begin + static_cast<std::uint32_t>(i);
  segment.wait_count = 1;
  segment.dest_flag = q;
  return segment;
}
// Wait `received_wait_begin + i` of a OncePerRank plan: the Received rows of the source that lands
// (i + 1)-th.
template <typename ReceivedFlag>
TILEMOE_HOST_DEVICE inline FlagWait received_wait(const StepCounts& c, DispatchOrder order, int rank, int i, ReceivedFlag received_flag) {
  const int q = dispatch_arrival(order, rank, 1 + i, c.world);
  return FlagWait{received_flag(rank, q), 1u, q};
}
// Wait `q` of [0, W) (every strategy's first waits): the rows from source q are in ExpertIn.
TILEMOE_HOST_DEVICE inline FlagWait source_rows_wait(const StepCounts& c, const SequentialShape& s, int q) {
  return FlagWait{static_cast<std::uint32_t>(q), static_cast<std::uint32_t>(c.local_experts), once_per_rank(s) ? s.rank : q};
}

// Source q's rows of rank r's local expert e, every column, from ExpertOut back where they land in
// q's permuted order (the combine's segments; a strategy adds columns, waits and flag).
TILEMOE_HOST_DEVICE inline Segment return_segment(const StepCounts& c, DispatchOrder order, int r, int e, int q, std::int64_t hidden) {
  const int L = c.local_experts;
  Segment segment;
  segment.src = BufferId::ExpertOut;
  segment.dst = BufferId::CombineIn;
  segment.dest_rank = q;
  segment.rows = c.count(q, r * L + e);
  segment.src_row = dispatch_block_row(c, order, r, e, q);
  segment.dst_row = c.offset_of(q, r * L + e);
  segment.col_begin = 0;
  segment.col_end = hidden;
  return segment;
}

// Segment `j` of the plan: the dispatch (dispatch_segment), then W L segments of the combine,
// local expert after local expert, source after source, after the whole GEMM1.
TILEMOE_HOST_DEVICE inline Segment sequential_segment(const StepCounts& c, const SequentialShape& s, const SequentialSummary& m,
                                                      int j) {
  const int W = c.world, L = c.local_experts, r = s.rank;
  const int dispatch = dispatch_segment_count(W, L, s.dispatch);
  if (j < dispatch) {
    return dispatch_segment(c, s, DispatchOrder::Ascending, j, [W](int, int q) { return sequential_received_flag(W, q); },
                            m.received_wait_begin);
  }
  const int e = (j - dispatch) / W, q = (j - dispatch) % W;
  Segment segment = return_segment(c, DispatchOrder::Ascending, r, e, q, s.hidden);
  if (m.real_tiles[1] > 0) {
    segment.wait_begin = m.layer_wait[1];
    segment.wait_count = 1;
  }
  segment.dest_flag = W + 2 + r;
  return segment;
}

// Whether rank s.rank's expert rows fit the layer's receive room (the plan has no tiles if not).
TILEMOE_HOST_DEVICE inline bool sequential_rows_fit(const StepCounts& c, const SequentialShape& s) {
  const std::int64_t rows = c.expert_rows(s.rank);
  return rows >= 0 && (s.receive_rows == 0 || rows <= s.receive_rows);
}

// Combine task `i`: a chunk of combine_tokens tokens, every column (its waits are the strategy's).
TILEMOE_HOST_DEVICE inline CombineTask token_chunk(const SequentialShape& s, std::int64_t i) {
  CombineTask task;
  task.token_begin = i * s.combine_tokens;
  task.token_end = task.token_begin + s.combine_tokens < s.tokens ? task.token_begin + s.combine_tokens : s.tokens;
  task.col_begin = 0;
  task.col_end = s.hidden;
  return task;
}

// What every compiler built on this one writes alike: the local experts' table (lanes as in
// compile_sequential_tables) and, by lane 0 last, the counts and the rows of the header
// (finish_plan); false when the plan is not whole, else the compiler fills the rest of its header.
TILEMOE_HOST_DEVICE inline void write_local_experts(const StepCounts& c, int r, const PlanSize& size, PlanTables& out, int lane, int lanes) {
  if (!size.fits[kExpertsTable]) return;
  const int L = c.local_experts;
  for (int e = lane; e < L; e += lanes) out.experts.data[e] = LocalExpert{r * L + e, c.expert_row(r, e), c.expert_row(r, e + 1)};
}
TILEMOE_HOST_DEVICE inline bool finish_rank_plan(const StepCounts& c, const SequentialShape& s, const PlanSize& size, bool rows_fit,
                                                  PlanTables& out) {
  const int r = s.rank;
  if (!finish_plan(out, size, rows_fit)) return false;
  out.header.expert_rows = c.expert_rows(r);
  out.header.combine_rows = c.offset_of(r, c.experts);
  out.header.received_rows = once_per_rank(s) ? c.received_rows(r) : 0;
  return true;
}

// Wait `w` of the plan (see SequentialSummary).
TILEMOE_HOST_DEVICE inline FlagWait sequential_wait(const StepCounts& c, const SequentialShape& s, const SequentialSummary& m,
                                                    std::uint32_t w) {
  const int W = c.world, L = c.local_experts, rank = s.rank;
  const auto u = [](std::int64_t v) { return static_cast<std::uint32_t>(v); };
  if (w < u(W)) return source_rows_wait(c, s, static_cast<int>(w));
  if (w >= m.received_wait_begin) {
    return received_wait(c, DispatchOrder::Ascending, rank, static_cast<int>(w - m.received_wait_begin),
                         [W](int, int q) { return sequential_received_flag(W, q); });
  }
  if (w >= m.combine_wait_begin) {
    const int d = static_cast<int>(w - m.combine_wait_begin);
    return FlagWait{u(W + 2 + d), u(L), d};
  }
  const int layer = w == m.layer_wait[0] && m.real_tiles[0] > 0 ? 0 : 1;
  return FlagWait{u(W + layer), u(m.real_tiles[layer]), rank};
}

// Lane `lane` of `lanes` (the compile grid's threads on the device; 0 of 1 on the host) writes the entries
// lane, lane + lanes, ... of every table; lane 0 also writes the header and the tables' counts
// into its copy of `out` (on the device, lane 0 copies it back). `tile_first`: the prefix sums
// (sequential_prefix), complete before any lane starts.
TILEMOE_HOST_DEVICE inline void compile_sequential_tables(const StepCounts& c, const SequentialShape& s, const int* tile_first,
                                                          PlanTables& out, int lane = 0, int lanes = 1) {
  const int W = c.world, L = c.local_experts, r = s.rank;
  const SequentialSummary m = summarize_sequential(c, s, tile_first);
  const std::int64_t tiles = m.layer_tiles[0] + m.layer_tiles[1];
  const std::int64_t segments = dispatch_segment_count(W, L, s.dispatch) + 1LL * W * L;
  const std::int64_t combines = ceil_div64(s.tokens, s.combine_tokens);
  const PlanSize size = plan_size(out, L, m.waits, tiles, segments, combines);
  const bool* fits = size.fits;
  const bool rows_fit = sequential_rows_fit(c, s);
  if (rows_fit && fits[kTilesTable] && fits[kComputeQueueTable]) {
    for (std::int64_t i = lane; i < tiles; i += lanes) {
      out.tiles.data[i] = sequential_tile(c, s, m, tile_first, i);
      out.compute_queue.data[i] = TaskRef{TaskKind::Gemm, static_cast<std::uint32_t>(i)};
    }
  }
  if (fits[kCombinesTable] && fits[kComputeQueueTable]) {  // the top-k sums, after the whole combine all-to-all
    for (std::int64_t i = lane; i < combines; i += lanes) {
      CombineTask task = token_chunk(s, i);
      task.wait_begin = m.combine_wait_begin;
      task.wait_count = static_cast<std::uint32_t>(W);
      out.combines.data[i] = task;
      out.compute_queue.data[tiles + i] = TaskRef{TaskKind::Combine, static_cast<std::uint32_t>(i)};
    }
  }
  if (fits[kSegmentsTable] && fits[kCommQueueTable]) {
    for (std::int64_t j = lane; j < segments; j += lanes) {
      out.segments.data[j] = sequential_segment(c, s, m, static_cast<int>(j));
      out.comm_queue.data[j] = TaskRef{TaskKind::Segment, static_cast<std::uint32_t>(j)};
    }
  }
  if (fits[kWaitsTable]) {
    for (std::uint32_t w = static_cast<std::uint32_t>(lane); w < m.waits; w += static_cast<std::uint32_t>(lanes)) {
      out.waits.data[w] = sequential_wait(c, s, m, w);
    }
  }
  write_local_experts(c, r, size, out, lane, lanes);
  if (lane != 0 || !finish_rank_plan(c, s, size, rows_fit, out)) return;
  PlanHeader& h = out.header;
  h.flag_count = sequential_flag_count(W, s.dispatch);
  h.layer_tiles[0] = static_cast<std::uint32_t>(m.layer_tiles[0]);
  h.layer_tiles[1] = static_cast<std::uint32_t>(m.layer_tiles[1]);
}

}  // namespace tilemoe::plan_detail
