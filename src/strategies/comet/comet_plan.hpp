#pragma once
// COMET's compiler (MLSys 2025; systems.md section 2), expert-parallel form: one code path from
// every rank's per-expert counts to one rank's plan, an entry per lane as the sequential
// compiler's (sequential_plan.hpp), so that a GPU can build the plan the CPU engine runs.
//
// layer0 (dispatch -> GEMM0) is split along tokens: inside each local expert the rows are
// grouped by source rank, this rank's own first, then the others in ring order (r + 1, r + 2,
// ...), and senders send in the matching order (rank p's step s goes to p - s), so the rows of
// rank r + i land i-th. GEMM0 takes the sources in waves of growing size (ring positions [0, 1),
// [1, 4), [4, 16), ...: comet_wave_begin), and inside a wave expert after expert: the expert's
// bands (tile_m rows) whose last source lies in the wave, column tile (1x2 pair) after column
// tile, so that the bands share each slice of the expert's weights while it is in L2. Band after
// band (every column of one band, then the next) re-read all of an expert's weights per band: at
// DeepSeek-V3's 128 rows per (expert, source), a band per source, GEMM0 was bound by the weights'
// reads and took 2x sequential's (2026-12-08, H100). Each wave's GEMM0 covers the next wave's
// arrival, and a tile waits only for the sources its rows come from: GEMM0 starts on local rows
// at once.
// layer1 (GEMM1 -> top-k reduce + combine) is split along hidden columns: GEMM1 runs one column
// split of split_cols columns across every band before the next split; as soon as a split is
// done, communication workers ship its columns of each (expert, source) group to the source,
// and the owner's communication workers reduce a token chunk's top-k outputs of that split once
// every expert rank's split has landed.
//
// Where the reduction runs: COMET reduces a token's outputs on the expert side. With expert
// parallelism a token's k experts sit on several ranks, and a partial sum per rank would add the
// k terms in a rank-dependent order. tilemoe's numerics sum a token's terms in top-k slot order
// on every backend, so the reduction of a column split runs on the owner. The bytes moved equal
// the sequential combine's.
//
// Flags of rank r (B_r its bands, S the splits), numbered so that every flag a segment raises
// sits below 2W + S W whatever the routing (a GPU's exchange holds them as counters in a room of
// fixed size): [0, W) the rows of source q are in ExpertIn (as sequential's: q's dispatch raises
// it, or with a dispatch once per rank r's placements), [W, 2W) q's rows have arrived in Received
// (a dispatch once per rank), [2W, 2W + S W) split s has arrived from expert rank d
// (2W + s W + d); then, raised by r's GEMMs, one per split (its GEMM1 tiles; at a fixed place,
// so that a GPU's GEMM1 raises them into an array the host sizes), then from band_flag one per
// band in row order (its GEMM0 tiles).
// Waits: [0, W) one per source in ring order (a band's sources are a run of them), then one per
// band (GEMM1's tiles of the band), one per split (its sends), one per (split, expert rank) (a
// split's reductions wait for its W), then the dispatch's own (received_wait_count).
//
// The GPU's tile order (SequentialShape::cluster N2, the planned GEMM's 1x2 pairs): each band's
// column tiles of a GEMM (of a split, in GEMM1) pair up, the last with a padding mate of no rows
// where their count is odd. A padding mate carries its partner's waits: its CTA loads part of
// the rows the pair shares.
#include <cstdint>

#include "strategies/sequential/sequential_plan.hpp"

namespace tilemoe::plan_detail {

struct CometShape {
  SequentialShape gemm;         // tiles (cluster None: COMET's tile order is its own), tokens, dispatch
  std::int64_t split_cols = 0;  // GEMM1 columns per split, > 0
};

TILEMOE_HOST_DEVICE inline int comet_splits(const CometShape& s) { return static_cast<int>(ceil_div64(s.gemm.hidden, s.split_cols)); }
TILEMOE_HOST_DEVICE inline int comet_split_width(const CometShape& s, int split) {
  const std::int64_t begin = split * s.split_cols, end = begin + s.split_cols < s.gemm.hidden ? begin + s.split_cols : s.gemm.hidden;
  return static_cast<int>(end - begin);
}
// GEMM1 tiles per band in a split, and GEMM0 tiles per band.
TILEMOE_HOST_DEVICE inline int comet_split_tiles(const CometShape& s, int split) {
  return static_cast<int>(ceil_div64(comet_split_width(s, split), s.gemm.tile_n[1]));
}
TILEMOE_HOST_DEVICE inline int comet_gemm0_tiles(const CometShape& s) { return static_cast<int>(ceil_div64(s.gemm.ffn_hidden, s.gemm.tile_n[0])); }
// Entries per band of `tiles` column tiles: with pairs (N2) an even count, the last a padding mate
// where `tiles` is odd.
TILEMOE_HOST_DEVICE inline int comet_band_entries(const CometShape& s, int tiles) {
  return s.gemm.cluster == cuda::PlannedCluster::N2 ? 2 * cuda::tile_ceil_div(tiles, 2) : tiles;
}

// Bands of rank r's local expert e whose rows end at or before row x of the expert (ring blocks
// end at such rows): x / tile_m, or all of them once x reaches the expert's rows.
TILEMOE_HOST_DEVICE inline int bands_ending_by(const StepCounts& c, int r, int e, int x, int tile_m) {
  const int rows = c.local_rows(r, e);
  return x >= rows ? cuda::tile_ceil_div(rows, tile_m) : x / tile_m;
}
// Where the rows of ring positions 0..p of rank r's expert e end (relative to the expert's first row).
TILEMOE_HOST_DEVICE inline int ring_block_end(const StepCounts& c, int r, int e, int p) {
  int end = 0;
  for (int i = 0; i <= p; ++i) end += c.count((r + i) % c.world, r * c.local_experts + e);
  return end;
}

// GEMM0's waves (above): wave k holds ring positions [comet_wave_begin(W, k), comet_wave_begin(W, k + 1)),
// empty past the world (k < W always covers it).
TILEMOE_HOST_DEVICE inline int comet_wave_begin(int world, int k) {
  int begin = 0;
  for (int i = 0, size = 1; i < k && begin < world; ++i, size = i == 1 ? 3 : 4 * size) begin += size;
  return begin < world ? begin : world;
}
// Bands of rank r's expert e whose last source lies in wave k.
TILEMOE_HOST_DEVICE inline int comet_wave_bands(const StepCounts& c, int r, int e, int k, int tile_m) {
  const int begin = comet_wave_begin(c.world, k), end = comet_wave_begin(c.world, k + 1);
  if (begin >= end) return 0;
  const int before = begin == 0 ? 0 : bands_ending_by(c, r, e, ring_block_end(c, r, e, begin - 1), tile_m);
  return bands_ending_by(c, r, e, ring_block_end(c, r, e, end - 1), tile_m) - before;
}

// Prefix sums (room: comet_prefix_size): band_first[e] the bands of the experts before e (e = L:
// B_r), order_first[k L + e] the GEMM0 places before the bands of expert e whose last source lies
// in wave k (k L + e = W L: B_r), gemm1_first[s] GEMM1's entries before split s (s = S: all of
// them).
TILEMOE_HOST_DEVICE inline int comet_prefix_size(int world, int local_experts, int splits) {
  return (local_experts + 1) + (world * local_experts + 1) + (splits + 1);
}
struct CometPrefix {
  const int* band_first = nullptr;
  const int* order_first = nullptr;
  const int* gemm1_first = nullptr;
};
TILEMOE_HOST_DEVICE inline CometPrefix comet_prefix_view(const int* prefix, int world, int local_experts) {
  CometPrefix x;
  x.band_first = prefix;
  x.order_first = x.band_first + local_experts + 1;
  x.gemm1_first = x.order_first + world * local_experts + 1;
  return x;
}
// The prefix sums on one thread (the host's way).
inline void comet_prefix(const StepCounts& c, const CometShape& s, int* prefix) {
  const int W = c.world, L = c.local_experts, r = s.gemm.rank, tm = static_cast<int>(s.gemm.tile_m);
  int* band_first = prefix;
  int* order_first = prefix + L + 1;
  int* gemm1_first = order_first + W * L + 1;
  int bands = 0;
  for (int e = 0; e < L; ++e) {
    band_first[e] = bands;
    bands += cuda::tile_ceil_div(c.local_rows(r, e), tm);
  }
  band_first[L] = bands;
  int places = 0;
  for (int k = 0; k < W; ++k) {
    for (int e = 0; e < L; ++e) {
      order_first[k * L + e] = places;
      places += comet_wave_bands(c, r, e, k, tm);
    }
  }
  order_first[W * L] = places;
  int tiles = 0;
  for (int split = 0; split < comet_splits(s); ++split) {
    gemm1_first[split] = tiles;
    tiles += bands * comet_band_entries(s, comet_split_tiles(s, split));
  }
  gemm1_first[comet_splits(s)] = tiles;
}

// What the tables are indexed by, from the prefix sums (O(1) per thread).
struct CometSummary {
  int bands = 0, splits = 0;
  int gemm0_tiles_per_band = 0, gemm0_entries_per_band = 0;  // real column tiles; entries with padding mates
  std::int64_t gemm0_tiles = 0, tiles = 0, dispatch = 0, segments = 0, chunks = 0, combines = 0;
  std::uint32_t band_flag = 0, split_flag = 0, arrival_flag = 0, flag_count = 0;
  std::uint32_t band_wait = 0, split_wait = 0, arrival_wait = 0, received_wait = 0, waits = 0;
};
// The flags segments raise: [0, comet_segment_flags) at every rank.
TILEMOE_HOST_DEVICE inline std::uint32_t comet_segment_flags(int world, int splits) { return static_cast<std::uint32_t>((2 + splits) * world); }
// A rank's flag that split s from expert rank q raises.
TILEMOE_HOST_DEVICE inline std::uint32_t comet_arrival_flag(int world, int split, int q) {
  return static_cast<std::uint32_t>(2 * world + split * world + q);
}
TILEMOE_HOST_DEVICE inline std::uint32_t comet_received_flag(int world, int q) { return static_cast<std::uint32_t>(world + q); }
// The flag rank r's GEMM1 raises once per tile of split s: the same place whatever the routing.
TILEMOE_HOST_DEVICE inline std::uint32_t comet_split_flag(int world, int splits, int split) {
  return comet_segment_flags(world, splits) + static_cast<std::uint32_t>(split);
}

TILEMOE_HOST_DEVICE inline CometSummary summarize_comet(const StepCounts& c, const CometShape& s, CometPrefix x) {
  const int W = c.world, L = c.local_experts;
  const auto u = [](std::int64_t v) { return static_cast<std::uint32_t>(v); };
  CometSummary m;
  m.bands = x.band_first[L];
  m.splits = comet_splits(s);
  m.gemm0_tiles_per_band = comet_gemm0_tiles(s);
  m.gemm0_entries_per_band = comet_band_entries(s, m.gemm0_tiles_per_band);
  m.gemm0_tiles = 1LL * m.bands * m.gemm0_entries_per_band;
  m.tiles = m.gemm0_tiles + x.gemm1_first[m.splits];
  m.dispatch = dispatch_segment_count(W, L, s.gemm.dispatch);
  m.segments = m.dispatch + 1LL * m.splits * W * L;
  m.chunks = ceil_div64(s.gemm.tokens, s.gemm.combine_tokens);
  m.combines = m.chunks * m.splits;
  m.arrival_flag = comet_arrival_flag(W, 0, 0);
  m.split_flag = comet_split_flag(W, m.splits, 0);
  m.band_flag = m.split_flag + u(m.splits);
  m.flag_count = m.band_flag + u(m.bands);
  m.band_wait = u(W);
  m.split_wait = m.band_wait + u(m.bands);
  m.arrival_wait = m.split_wait + u(m.splits);
  m.received_wait = m.arrival_wait + u(1LL * m.splits * W);
  m.waits = m.received_wait + u(received_wait_count(W, s.gemm.dispatch));
  return m;
}

// A band of rank r's rows: expert e's band m, `id` in row order across experts.
struct CometBand {
  int expert = 0, m = 0, id = 0;
  int row_begin = 0, rows = 0;  // rows in ExpertIn
};
TILEMOE_HOST_DEVICE inline CometBand comet_band(const StepCounts& c, const CometShape& s, CometPrefix x, int e, int m) {
  const int r = s.gemm.rank, tm = static_cast<int>(s.gemm.tile_m);
  CometBand band;
  band.expert = e;
  band.m = m;
  band.id = x.band_first[e] + m;
  band.row_begin = c.expert_row(r, e) + m * tm;
  const int left = c.local_rows(r, e) - m * tm;
  band.rows = left < tm ? left : tm;
  return band;
}
// The (wave, expert) group of GEMM0 place `b`, and the group's `n`-th band.
TILEMOE_HOST_DEVICE inline int comet_group_at_place(const StepCounts& c, CometPrefix x, int b) {
  return expert_at(c.world * c.local_experts, b, [&](int g) { return x.order_first[g]; });
}
TILEMOE_HOST_DEVICE inline CometBand comet_band_of_group(const StepCounts& c, const CometShape& s, CometPrefix x, int group, int n) {
  const int L = c.local_experts, r = s.gemm.rank, tm = static_cast<int>(s.gemm.tile_m);
  const int begin = comet_wave_begin(c.world, group / L), e = group % L;
  const int first = begin == 0 ? 0 : bands_ending_by(c, r, e, ring_block_end(c, r, e, begin - 1), tm);
  return comet_band(c, s, x, e, first + n);
}

// GEMM tile `i`: GEMM0's (wave, expert) groups in place order, inside a group column tile (or
// 1x2 pair) after column tile, the group's bands in place order for each, every tile waiting for
// the ring positions its rows come from; then GEMM1's, split after split, bands in row order
// inside a split, waiting for the band's GEMM0.
TILEMOE_HOST_DEVICE inline GemmTile comet_tile(const StepCounts& c, const CometShape& s, const CometSummary& m, CometPrefix x,
                                               std::int64_t i) {
  const int r = s.gemm.rank;
  GemmTile tile;
  if (i < m.gemm0_tiles) {
    const int per_band = m.gemm0_entries_per_band, unit = s.gemm.cluster == cuda::PlannedCluster::N2 ? 2 : 1;
    const int group = comet_group_at_place(c, x, static_cast<int>(i / per_band));
    const int group_first = x.order_first[group], bands = x.order_first[group + 1] - group_first;
    const int in_group = static_cast<int>(i - 1LL * group_first * per_band), units = in_group / unit;
    const CometBand band = comet_band_of_group(c, s, x, group, units % bands);
    int col = units / bands * unit + in_group % unit;
    const bool padding = col >= m.gemm0_tiles_per_band;  // its partner's copy, of no rows
    if (padding) col -= 1;
    tile.layer = 0;
    tile.expert = band.expert;
    tile.row_begin = band.row_begin;
    tile.row_end = padding ? band.row_begin : band.row_begin + band.rows;
    tile.col_begin = col * s.gemm.tile_n[0];
    tile.col_end = tile.col_begin + s.gemm.tile_n[0] < s.gemm.ffn_hidden ? tile.col_begin + s.gemm.tile_n[0] : s.gemm.ffn_hidden;
    // the ring positions of the band's first and last rows
    const int lo = band.row_begin - c.expert_row(r, band.expert), hi = lo + band.rows - 1;
    int first = 0;
    while (ring_block_end(c, r, band.expert, first) <= lo) ++first;
    int last = first;
    while (ring_block_end(c, r, band.expert, last) <= hi) ++last;
    tile.wait_begin = static_cast<std::uint32_t>(first);
    tile.wait_count = static_cast<std::uint32_t>(last - first + 1);
    tile.signal_flag = padding ? kNoFlag : static_cast<std::int32_t>(m.band_flag) + band.id;
    return tile;
  }
  const int j = static_cast<int>(i - m.gemm0_tiles);
  const int split = expert_at(m.splits, j, [&](int t) { return x.gemm1_first[t]; });
  const int real = comet_split_tiles(s, split), per_band = comet_band_entries(s, real), in_split = j - x.gemm1_first[split];
  const int id = in_split / per_band;
  int col = in_split % per_band;
  const bool padding = col >= real;
  if (padding) col -= 1;
  const int e = expert_at(c.local_experts, id, [&](int t) { return x.band_first[t]; });
  const CometBand band = comet_band(c, s, x, e, id - x.band_first[e]);
  const std::int64_t split_begin = split * s.split_cols, split_end = split_begin + comet_split_width(s, split);
  tile.layer = 1;
  tile.expert = e;
  tile.row_begin = band.row_begin;
  tile.row_end = padding ? band.row_begin : band.row_begin + band.rows;
  tile.col_begin = split_begin + col * s.gemm.tile_n[1];
  tile.col_end = tile.col_begin + s.gemm.tile_n[1] < split_end ? tile.col_begin + s.gemm.tile_n[1] : split_end;
  tile.wait_begin = m.band_wait + static_cast<std::uint32_t>(band.id);
  tile.wait_count = 1;
  tile.signal_flag = padding ? kNoFlag : static_cast<std::int32_t>(m.split_flag) + split;
  return tile;
}

// Segment `j`: the dispatch (dispatch_segment, ring order), then per split, per local expert,
// per source in ring order: the group's columns of the split back where they land in the
// source's CombineIn, after the split's GEMM1 (empty groups too: an arrival counts L signals).
TILEMOE_HOST_DEVICE inline Segment comet_segment(const StepCounts& c, const CometShape& s, const CometSummary& m, std::int64_t j) {
  const int W = c.world, L = c.local_experts, r = s.gemm.rank;
  if (j < m.dispatch) {
    return dispatch_segment(c, s.gemm, DispatchOrder::Ring, static_cast<int>(j), [W](int, int q) { return comet_received_flag(W, q); },
                            m.received_wait);
  }
  const std::int64_t k = j - m.dispatch;
  const int split = static_cast<int>(k / (1LL * W * L)), e = static_cast<int>(k / W % L), q = (r + static_cast<int>(k % W)) % W;
  Segment segment = return_segment(c, DispatchOrder::Ring, r, e, q, s.gemm.hidden);
  segment.col_begin = split * s.split_cols;
  segment.col_end = segment.col_begin + comet_split_width(s, split);
  if (m.bands > 0) {
    segment.wait_begin = m.split_wait + static_cast<std::uint32_t>(split);
    segment.wait_count = 1;
  }
  segment.dest_flag = static_cast<std::int32_t>(comet_arrival_flag(W, split, r));
  return segment;
}

// Combine task `i`: split after split, token chunk after chunk; a chunk of a split waits for that
// split from every expert rank.
TILEMOE_HOST_DEVICE inline CombineTask comet_combine(const CometShape& s, const CometSummary& m, int world, std::int64_t i) {
  const int split = static_cast<int>(i / m.chunks);
  CombineTask task = token_chunk(s.gemm, i % m.chunks);
  task.col_begin = split * s.split_cols;
  task.col_end = task.col_begin + comet_split_width(s, split);
  task.wait_begin = m.arrival_wait + static_cast<std::uint32_t>(split * world);
  task.wait_count = static_cast<std::uint32_t>(world);
  return task;
}

// The communication queue's entry `n`: the dispatch, then the sends of split 0, then rounds of a
// split's sends and the reductions of the split before it, then the last split's reductions: a
// worker never blocks on a reduction before the next split's sends are queued.
TILEMOE_HOST_DEVICE inline TaskRef comet_comm_entry(const CometSummary& m, int world, int local_experts, std::int64_t n) {
  const auto ref = [](TaskKind kind, std::int64_t index) { return TaskRef{kind, static_cast<std::uint32_t>(index)}; };
  const std::int64_t sends = 1LL * world * local_experts;
  if (n < m.dispatch + sends) return ref(TaskKind::Segment, n);
  const std::int64_t k = n - m.dispatch - sends, round = sends + m.chunks, t = k / round, at = k % round;
  if (t < m.splits - 1) {  // round t: split t + 1's sends, split t's reductions
    return at < sends ? ref(TaskKind::Segment, m.dispatch + (t + 1) * sends + at) : ref(TaskKind::Combine, t * m.chunks + at - sends);
  }
  return ref(TaskKind::Combine, (m.splits - 1) * m.chunks + k - (m.splits - 1) * round);
}

// Wait `w` of the plan.
TILEMOE_HOST_DEVICE inline FlagWait comet_wait(const StepCounts& c, const CometShape& s, const CometSummary& m, std::uint32_t w) {
  const int W = c.world, L = c.local_experts, r = s.gemm.rank;
  const auto u = [](std::int64_t v) { return static_cast<std::uint32_t>(v); };
  if (w < u(W)) return source_rows_wait(c, s.gemm, (r + static_cast<int>(w)) % W);
  if (w < m.split_wait) return FlagWait{m.band_flag + (w - m.band_wait), u(m.gemm0_tiles_per_band), r};
  if (w < m.arrival_wait) {
    const int split = static_cast<int>(w - m.split_wait);
    return FlagWait{m.split_flag + u(split), u(1LL * m.bands * comet_split_tiles(s, split)), r};
  }
  if (w < m.received_wait) {  // split (w - arrival_wait) / W from expert rank (w - arrival_wait) % W
    return FlagWait{m.arrival_flag + (w - m.arrival_wait), u(L), static_cast<std::int32_t>((w - m.arrival_wait) % u(W))};
  }
  return received_wait(c, DispatchOrder::Ring, r, static_cast<int>(w - m.received_wait), [W](int, int q) { return comet_received_flag(W, q); });
}

// Room for any step of a layer whose ranks receive at most `max_rows` expert rows and own at most
// `max_tokens` tokens.
inline PlanCapacity comet_capacity(int world, int local_experts, std::int64_t max_rows, std::int64_t max_tokens, const CometShape& s) {
  const std::int64_t bands = max_rows / s.gemm.tile_m + local_experts, splits = comet_splits(s);
  std::int64_t gemm1 = 0;
  for (int split = 0; split < splits; ++split) gemm1 += bands * comet_band_entries(s, comet_split_tiles(s, split));
  const std::int64_t tiles = bands * comet_band_entries(s, comet_gemm0_tiles(s)) + gemm1;
  const std::int64_t combines = ceil_div64(max_tokens, s.gemm.combine_tokens) * splits;
  const std::int64_t segments = dispatch_segment_count(world, local_experts, s.gemm.dispatch) + splits * world * local_experts;
  const std::int64_t waits = world + bands + splits + splits * world + received_wait_count(world, s.gemm.dispatch);
  return checked_capacity({local_experts, waits, tiles, segments, combines, tiles, segments + combines});
}

// Lane `lane` of `lanes` writes entries lane, lane + lanes, ... of every table (as
// compile_sequential_tables); the prefix sums (comet_prefix) are complete before any lane starts.
TILEMOE_HOST_DEVICE inline void compile_comet_tables(const StepCounts& c, const CometShape& s, const int* prefix, PlanTables& out,
                                                     int lane = 0, int lanes = 1) {
  const int W = c.world, L = c.local_experts;
  const CometPrefix x = comet_prefix_view(prefix, W, L);
  const CometSummary m = summarize_comet(c, s, x);
  const PlanSize size = plan_size(out, L, m.waits, m.tiles, m.segments, m.combines, true);
  const bool* fits = size.fits;
  const bool rows_fit = sequential_rows_fit(c, s.gemm);
  if (rows_fit && fits[kTilesTable] && fits[kComputeQueueTable]) {
    for (std::int64_t i = lane; i < m.tiles; i += lanes) {
      out.tiles.data[i] = comet_tile(c, s, m, x, i);
      out.compute_queue.data[i] = TaskRef{TaskKind::Gemm, static_cast<std::uint32_t>(i)};
    }
  }
  if (fits[kCombinesTable]) {
    for (std::int64_t i = lane; i < m.combines; i += lanes) out.combines.data[i] = comet_combine(s, m, W, i);
  }
  if (fits[kSegmentsTable]) {
    for (std::int64_t j = lane; j < m.segments; j += lanes) out.segments.data[j] = comet_segment(c, s, m, j);
  }
  if (fits[kCommQueueTable]) {
    for (std::int64_t n = lane; n < m.segments + m.combines; n += lanes) out.comm_queue.data[n] = comet_comm_entry(m, W, L, n);
  }
  if (fits[kWaitsTable]) {
    for (std::uint32_t w = static_cast<std::uint32_t>(lane); w < m.waits; w += static_cast<std::uint32_t>(lanes)) {
      out.waits.data[w] = comet_wait(c, s, m, w);
    }
  }
  write_local_experts(c, s.gemm.rank, size, out, lane, lanes);
  if (lane != 0 || !finish_rank_plan(c, s.gemm, size, rows_fit, out)) return;
  PlanHeader& h = out.header;
  h.flag_count = m.flag_count;
  h.layer_tiles[0] = static_cast<std::uint32_t>(m.gemm0_tiles);
  h.layer_tiles[1] = static_cast<std::uint32_t>(m.tiles - m.gemm0_tiles);
}

}  // namespace tilemoe::plan_detail
