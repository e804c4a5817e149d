#pragma once
// The sequential strategy's compiler: one code path from every rank's per-expert counts to one
// rank's plan, run by the host (compile_plan) and by a kernel on the GPU (device_plan.cu).
//
// The schedule: the dispatch all-to-all (rank r sends to r, r + 1, ...; a segment per non-empty
// (destination, local expert) group), every local expert's GEMM0 tiles, then every GEMM1 tile
// (in the planned GEMM's order, which the GPU's GEMMs walk),
// the combine all-to-all (a segment per non-empty (local expert, source) group, back to the
// source), then the top-k sums in token chunks. Each phase waits for the whole phase before it.
//
// Flags of rank r, numbered so that any rank can name a peer's: [0, W) the dispatch arrivals
// from sender p (one count per segment), W the GEMM0 tiles, W + 1 the GEMM1 tiles,
// [W + 2, 2W + 2) the combine arrivals from expert rank d.
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
};

TILEMOE_HOST_DEVICE inline std::uint32_t sequential_flag_count(int world) { return static_cast<std::uint32_t>(2 * world + 2); }

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
  const std::int64_t segments = 2LL * world * local_experts;
  return checked_capacity({local_experts, 2LL * world + 2, tiles, segments, combines, tiles + combines, segments});
}

// What every part of the compiler needs first, cheap to compute (W x L) on each thread: where
// each phase's shared waits sit, and how many tiles each GEMM has.
struct SequentialSummary {
  std::uint32_t dispatch_waits = 0;   // waits [0, dispatch_waits): one per sender
  std::int64_t layer_tiles[2] = {0, 0};  // entries of each GEMM, padding mates included
  std::int64_t real_tiles[2] = {0, 0};   // those that compute rows (and raise the GEMM's flag)
  std::uint32_t layer_wait[2] = {0, 0};  // the wait for all of GEMM0 / GEMM1 (if it has tiles)
  std::uint32_t combine_waits = 0;    // waits [combine_wait_begin, +combine_waits): one per expert rank
  std::uint32_t combine_wait_begin = 0;
};

TILEMOE_HOST_DEVICE inline SequentialSummary summarize_sequential(const StepCounts& c, const SequentialShape& s) {
  const int W = c.world, L = c.local_experts, r = s.rank;
  SequentialSummary m;
  for (int p = 0; p < W; ++p) m.dispatch_waits += c.groups_from(p, r) > 0 ? 1u : 0u;
  for (int layer = 0; layer < 2; ++layer) {
    const int col_tiles = sequential_column_tiles(s, layer);
    for (int e = 0; e < L; ++e) {
      const cuda::GroupTiles g = cuda::group_tiles(c.local_rows(r, e), col_tiles, s.cluster, static_cast<int>(s.tile_m));
      m.layer_tiles[layer] += g.entries;
      m.real_tiles[layer] += static_cast<std::int64_t>(g.m_tiles) * col_tiles;
    }
  }
  std::uint32_t at = m.dispatch_waits;
  for (int layer = 0; layer < 2; ++layer) {
    m.layer_wait[layer] = at;
    at += m.real_tiles[layer] > 0 ? 1u : 0u;
  }
  m.combine_wait_begin = at;
  for (int d = 0; d < W; ++d) m.combine_waits += c.groups_from(r, d) > 0 ? 1u : 0u;
  return m;
}

// GEMM tile `i` of the plan: GEMM0's tiles, then GEMM1's, each GEMM's in the order the planned
// GEMM runs them (the sequential table of plan/tile_table.hpp, one decode for both sides).
// GEMM0 waits for the whole dispatch, GEMM1 for all of GEMM0; a padding mate (no rows) computes
// nothing and raises nothing.
TILEMOE_HOST_DEVICE inline GemmTile sequential_tile(const StepCounts& c, const SequentialShape& s, const SequentialSummary& m,
                                                    std::int64_t i) {
  const int W = c.world, r = s.rank;
  const int layer = i < m.layer_tiles[0] ? 0 : 1;
  const std::int64_t index = layer == 0 ? i : i - m.layer_tiles[0];
  const int col_tiles = sequential_column_tiles(s, layer), tile_m = static_cast<int>(s.tile_m);
  // the expert holding entry `index`
  int e = 0;
  std::int64_t first = 0;
  for (; e < c.local_experts - 1; ++e) {
    const int n = cuda::group_tiles(c.local_rows(r, e), col_tiles, s.cluster, tile_m).entries;
    if (index < first + n) break;
    first += n;
  }
  const cuda::GemmTileEntry entry =
      cuda::decode_entry(e, c.expert_row(r, e), c.local_rows(r, e), 0, static_cast<int>(index - first), static_cast<int>(index),
                         col_tiles, s.cluster, cuda::TileFlags::None, s.band_block[layer], tile_m);
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
  tile.wait_count = layer == 0 ? m.dispatch_waits : 1u;
  return tile;
}

// Lane `lane` of `lanes` (one CTA's threads on the device; 0 of 1 on the host) writes GEMM tiles
// lane, lane + lanes, ... and their compute-queue entries; lane 0 writes everything else and the
// tables' counts, into its own copy of `out` (on the device, lane 0 copies it back).
TILEMOE_HOST_DEVICE inline void compile_sequential_tables(const StepCounts& c, const SequentialShape& s, PlanTables& out, int lane = 0,
                                                          int lanes = 1) {
  const int W = c.world, L = c.local_experts, r = s.rank;
  const SequentialSummary m = summarize_sequential(c, s);
  const std::int64_t tiles = m.layer_tiles[0] + m.layer_tiles[1];
  for (std::int64_t i = lane; i < tiles; i += lanes) {
    const GemmTile tile = sequential_tile(c, s, m, i);
    if (i < out.tiles.capacity) out.tiles.data[i] = tile;
    if (i < out.compute_queue.capacity) out.compute_queue.data[i] = TaskRef{TaskKind::Gemm, static_cast<std::uint32_t>(i)};
  }
  if (lane != 0) return;

  clear_plan(out);
  PlanHeader& h = out.header;
  h.expert_rows = c.expert_rows(r);
  h.combine_rows = c.offset_of(r, c.experts);
  h.flag_count = sequential_flag_count(W);
  // the tiles the lanes wrote
  if (tiles > out.tiles.capacity) {
    h.overflow = kTilesTable + 1;
  } else if (tiles > out.compute_queue.capacity) {
    h.overflow = kComputeQueueTable + 1;
  } else {
    out.tiles.count = out.compute_queue.count = static_cast<std::uint32_t>(tiles);
    h.layer_tiles[0] = static_cast<std::uint32_t>(m.layer_tiles[0]);
    h.layer_tiles[1] = static_cast<std::uint32_t>(m.layer_tiles[1]);
  }

  for (int e = 0; e < L; ++e) {
    plan_push(out.experts, LocalExpert{r * L + e, c.expert_row(r, e), c.expert_row(r, e + 1)}, h, kExpertsTable);
  }
  // the waits, shared by every task of a phase, where the summary says
  for (int p = 0; p < W; ++p) {
    const int groups = c.groups_from(p, r);
    if (groups > 0) plan_push(out.waits, FlagWait{static_cast<std::uint32_t>(p), static_cast<std::uint32_t>(groups), p}, h, kWaitsTable);
  }
  for (int layer = 0; layer < 2; ++layer) {
    if (m.real_tiles[layer] > 0) {
      plan_push(out.waits, FlagWait{static_cast<std::uint32_t>(W + layer), static_cast<std::uint32_t>(m.real_tiles[layer]), r}, h,
                kWaitsTable);
    }
  }
  for (int d = 0; d < W; ++d) {
    const int groups = c.groups_from(r, d);
    if (groups > 0) {
      plan_push(out.waits, FlagWait{static_cast<std::uint32_t>(W + 2 + d), static_cast<std::uint32_t>(groups), d}, h, kWaitsTable);
    }
  }

  // the top-k sums, after the whole combine all-to-all has landed
  for (std::int64_t token = 0; token < s.tokens; token += s.combine_tokens) {
    CombineTask task;
    task.token_begin = token;
    task.token_end = token + s.combine_tokens < s.tokens ? token + s.combine_tokens : s.tokens;
    task.col_begin = 0;
    task.col_end = s.hidden;
    task.wait_begin = m.combine_wait_begin;
    task.wait_count = m.combine_waits;
    const std::uint32_t index = plan_push(out.combines, task, h, kCombinesTable);
    plan_push(out.compute_queue, TaskRef{TaskKind::Combine, index}, h, kComputeQueueTable);
  }

  // the dispatch: this rank's permuted rows of each (destination, local expert) group
  for (int step = 0; step < W; ++step) {
    const int d = (r + step) % W;
    for (int e = 0; e < L; ++e) {
      const int rows = c.count(r, d * L + e);
      if (rows == 0) continue;
      Segment segment;
      segment.src = BufferId::Input;
      segment.dst = BufferId::ExpertIn;
      segment.dest_rank = d;
      segment.rows = rows;
      segment.gather_begin = static_cast<std::uint32_t>(c.offset_of(r, d * L + e));
      segment.gather_count = static_cast<std::uint32_t>(rows);
      segment.dst_row = c.block_row(d, e, r);
      segment.col_begin = 0;
      segment.col_end = s.hidden;
      segment.dest_flag = r;
      const std::uint32_t index = plan_push(out.segments, segment, h, kSegmentsTable);
      plan_push(out.comm_queue, TaskRef{TaskKind::Segment, index}, h, kCommQueueTable);
    }
  }
  // the combine all-to-all, after the whole GEMM1: each (local expert, source) group back to its
  // source, where it lands in the source's permuted order
  for (int e = 0; e < L; ++e) {
    for (int q = 0; q < W; ++q) {
      const int rows = c.count(q, r * L + e);
      if (rows == 0) continue;
      Segment segment;
      segment.src = BufferId::ExpertOut;
      segment.dst = BufferId::CombineIn;
      segment.dest_rank = q;
      segment.rows = rows;
      segment.src_row = c.block_row(r, e, q);
      segment.dst_row = c.offset_of(q, r * L + e);
      segment.col_begin = 0;
      segment.col_end = s.hidden;
      segment.wait_begin = m.layer_wait[1];
      segment.wait_count = 1;
      segment.dest_flag = W + 2 + r;
      const std::uint32_t index = plan_push(out.segments, segment, h, kSegmentsTable);
      plan_push(out.comm_queue, TaskRef{TaskKind::Segment, index}, h, kCommQueueTable);
    }
  }
}

}  // namespace tilemoe::plan_detail
