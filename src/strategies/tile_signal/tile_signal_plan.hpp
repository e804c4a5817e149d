#pragma once
// tile_signal's compiler (ICPP 2026; systems.md section 1): one code path from every rank's
// per-expert counts to one rank's plan, for the host (compile_plan) and the device alike, an
// entry per thread as the sequential compiler is (sequential_plan.hpp).
//
// The schedule: the dispatch and GEMM0 as in `sequential`, and the same rows (each local
// expert's rows grouped by source rank, ascending, no padding), so the output is bitwise the
// sequential one. A band is tile_m consecutive rows of one expert; it may hold rows of several
// owners. GEMM1 runs in the planned GEMM's table order on 1x2 pairs (each expert's bands in
// blocks of band_block), the pairs of bands holding other ranks' rows first (a stable
// partition), and each tile raises its band's flag. The communication worker takes the bands in
// the same remote-first order, bands_per_segment at a time: each band waits for its segment's
// bands and ships its rows back, a piece per source rank, each row raising its own arrival flag
// at the owner. An owner combines a token chunk as soon as the rows it reads have landed.
//
// Flags of rank r: [0, W) the rows from source q are in ExpertIn (as sequential's), W the GEMM0
// tiles, with a dispatch once per rank [W + 1, 2W + 1) q's rows have arrived in Received, then
// one per band of r's rows in row order from band_flag (W + 1, or 2W + 1 with a dispatch once
// per rank: a GPU GEMM raises them at an offset the layer knows), then one per CombineIn row
// (row_arrival_flag = band_flag + B_r; a sender finds B_q from the counts). Every flag that a
// segment raises at a peer but the rows' arrival flags is below 2W + 1, whatever the routing.
// Waits: [0, W) one per source, W all of GEMM0 (if r has rows), then one per band in the
// remote-first order (a segment's bands are consecutive waits), then the dispatch's own
// (received_wait_count).
//
// Where a band stands in the remote-first order is a closed form: the bands of expert e that
// hold only this rank's rows are one run [lo, hi) of its bands (its rows are grouped by source),
// so the remote ones before any band or pair follow from lo, hi and per-expert prefix sums.
#include <cstdint>

#include "strategies/sequential/sequential_plan.hpp"

namespace tilemoe::plan_detail {

struct TileSignalShape {
  SequentialShape gemm;       // tiling, tokens and room; its cluster must be N2 (pairs)
  int bands_per_segment = 1;  // the bands a communication segment waits for at once
};

// Expert e's bands [lo, hi) of rank r that hold rows of rank r only.
struct OwnBands {
  int lo = 0, hi = 0;
};
TILEMOE_HOST_DEVICE inline OwnBands own_bands(const StepCounts& c, int r, int e, int tile_m) {
  const int rows = c.local_rows(r, e), bands = cuda::tile_ceil_div(rows, tile_m);
  const int a = c.block_row(r, e, r) - c.expert_row(r, e), z = a + c.count(r, r * c.local_experts + e);
  OwnBands own;
  own.lo = cuda::tile_ceil_div(a, tile_m);
  own.hi = z == rows ? bands : z / tile_m;
  if (own.hi < own.lo) own.hi = own.lo;
  return own;
}
// Bands [x, y) of an expert that hold other ranks' rows.
TILEMOE_HOST_DEVICE inline int remote_bands(OwnBands own, int x, int y) {
  const int lo = own.lo > x ? own.lo : x, hi = own.hi < y ? own.hi : y;
  return (y - x) - (hi > lo ? hi - lo : 0);
}

TILEMOE_HOST_DEVICE inline int tile_signal_pairs(const SequentialShape& s) { return cuda::tile_ceil_div(sequential_column_tiles(s, 1), 2); }

// Prefix sums: the sequential ones (sequential_prefix), then remote[e] = GEMM1 pairs of remote
// bands of the experts before e (e = L: all of them). Room: tile_signal_prefix_size(L).
TILEMOE_HOST_DEVICE inline int tile_signal_prefix_size(int local_experts) { return sequential_prefix_size(local_experts) + local_experts + 1; }
TILEMOE_HOST_DEVICE inline int tile_signal_remote_pairs(const StepCounts& c, const SequentialShape& s, int e) {
  const OwnBands own = own_bands(c, s.rank, e, static_cast<int>(s.tile_m));
  return tile_signal_pairs(s) * remote_bands(own, 0, cuda::tile_ceil_div(c.local_rows(s.rank, e), static_cast<int>(s.tile_m)));
}
inline void tile_signal_prefix(const StepCounts& c, const SequentialShape& s, int* prefix) {
  sequential_prefix(c, s, prefix);
  int* remote = prefix + sequential_prefix_size(c.local_experts);
  int running = 0;
  for (int e = 0; e < c.local_experts; ++e) {
    remote[e] = running;
    running += tile_signal_remote_pairs(c, s, e);
  }
  remote[c.local_experts] = running;
}

// The bands of rank q's rows (O(L): the senders of pieces to q need q's row arrival flags).
TILEMOE_HOST_DEVICE inline int bands_of_rank(const StepCounts& c, int q, int tile_m) {
  int bands = 0;
  for (int e = 0; e < c.local_experts; ++e) bands += cuda::tile_ceil_div(c.local_rows(q, e), tile_m);
  return bands;
}
TILEMOE_HOST_DEVICE inline std::uint32_t tile_signal_band_flag(int world, DispatchVolume dispatch) {
  return static_cast<std::uint32_t>(world + 1 + (dispatch == DispatchVolume::OncePerRank ? world : 0));
}
TILEMOE_HOST_DEVICE inline std::uint32_t tile_signal_row_arrival_flag(const StepCounts& c, const SequentialShape& s, int q) {
  return tile_signal_band_flag(c.world, s.dispatch) + static_cast<std::uint32_t>(bands_of_rank(c, q, static_cast<int>(s.tile_m)));
}
// Rank d's flag that source q's Received rows raise (a dispatch once per rank).
TILEMOE_HOST_DEVICE inline std::uint32_t tile_signal_received_flag(int world, int q) { return static_cast<std::uint32_t>(world + 1 + q); }

// What the tables are indexed by, from the prefix sums (O(1) per thread).
struct TileSignalSummary {
  SequentialSummary seq;       // GEMM tiles per layer (its waits layout is not this plan's)
  int pairs = 0;               // GEMM1 column pairs
  int bands = 0, remote_bands = 0;
  std::uint32_t row_arrival_flag = 0, band_flag = 0, flag_count = 0;
  std::uint32_t band_wait = 0, received_wait = 0, waits = 0;
};

TILEMOE_HOST_DEVICE inline TileSignalSummary summarize_tile_signal(const StepCounts& c, const SequentialShape& s, const int* prefix) {
  const int W = c.world, L = c.local_experts;
  TileSignalSummary m;
  m.seq = summarize_sequential(c, s, prefix);
  m.pairs = tile_signal_pairs(s);
  m.bands = prefix[(L + 2) + L] / (2 * m.pairs);
  m.remote_bands = prefix[sequential_prefix_size(L) + L] / m.pairs;
  m.band_flag = tile_signal_band_flag(W, s.dispatch);
  m.row_arrival_flag = m.band_flag + static_cast<std::uint32_t>(m.bands);
  m.flag_count = m.row_arrival_flag + static_cast<std::uint32_t>(c.offset_of(s.rank, c.experts));
  m.band_wait = static_cast<std::uint32_t>(W) + (m.seq.real_tiles[0] > 0 ? 1u : 0u);
  m.received_wait = m.band_wait + static_cast<std::uint32_t>(m.bands);
  m.waits = m.received_wait + static_cast<std::uint32_t>(received_wait_count(W, s.dispatch));
  return m;
}

// Dispatch segment `j` of the plan (dispatch_segment, with this strategy's flags and waits).
TILEMOE_HOST_DEVICE inline Segment tile_signal_dispatch_segment(const StepCounts& c, const SequentialShape& s, const TileSignalSummary& m,
                                                                int j) {
  const int W = c.world;
  return dispatch_segment(c, s, DispatchOrder::Ascending, j, [W](int, int q) { return tile_signal_received_flag(W, q); }, m.received_wait);
}

// A band of rank s.rank's rows: expert e's band m, numbered `id` in row order across experts.
struct PlanBand {
  int expert = 0, m = 0, id = 0;
  int row_begin = 0, rows = 0;
};

// The band at place `b` of the remote-first order.
TILEMOE_HOST_DEVICE inline PlanBand tile_signal_band(const StepCounts& c, const SequentialShape& s, const TileSignalSummary& m,
                                                     const int* prefix, int b) {
  const int L = c.local_experts, r = s.rank, tm = static_cast<int>(s.tile_m);
  const int* first = prefix + (L + 2);                              // GEMM1 entries before expert e (2 x pairs x bands)
  const int* remote = prefix + sequential_prefix_size(L);           // remote pairs before expert e
  const auto bands_before = [&](int e) { return first[e] / (2 * m.pairs); };
  const auto remote_before = [&](int e) { return remote[e] / m.pairs; };
  PlanBand band;
  if (b < m.remote_bands) {
    band.expert = expert_at(L, b, remote_before);
    const OwnBands own = own_bands(c, r, band.expert, tm);
    const int j = b - remote_before(band.expert);
    band.m = j < own.lo ? j : j + (own.hi - own.lo);
  } else {
    const int j = b - m.remote_bands;
    band.expert = expert_at(L, j, [&](int e) { return bands_before(e) - remote_before(e); });
    const OwnBands own = own_bands(c, r, band.expert, tm);
    band.m = own.lo + j - (bands_before(band.expert) - remote_before(band.expert));
  }
  band.id = bands_before(band.expert) + band.m;
  band.row_begin = c.expert_row(r, band.expert) + band.m * tm;
  const int left = c.local_rows(r, band.expert) - band.m * tm;
  band.rows = left < tm ? left : tm;
  return band;
}

// GEMM1's entry `index` of the sequential order, and where the remote-first order puts it
// (*place, counted within GEMM1).
TILEMOE_HOST_DEVICE inline GemmTile tile_signal_gemm1_tile(const StepCounts& c, const SequentialShape& s, const TileSignalSummary& m,
                                                           const int* prefix, int index, int* place) {
  const int W = c.world, L = c.local_experts, r = s.rank, tm = static_cast<int>(s.tile_m);
  const int* first = prefix + (L + 2);
  const int* remote = prefix + sequential_prefix_size(L);
  const int e = expert_at(L, index, [&](int x) { return first[x]; });
  const int rows = c.local_rows(r, e), bands = cuda::tile_ceil_div(rows, tm);
  const int local = index - first[e], pair = local / 2, mate = local % 2;
  const cuda::GemmTileEntry entry =
      cuda::decode_entry(e, c.expert_row(r, e), rows, first[e] / (2 * m.pairs), local, index, sequential_column_tiles(s, 1),
                         cuda::PlannedCluster::N2, cuda::TileFlags::PerBand, s.band_block[1], tm);
  // the pair's band and the remote pairs before it in the expert's order: blocks of `block`
  // bands, in a block column pair after column pair, the block's bands fastest
  const int block = s.band_block[1] <= 0 || s.band_block[1] >= bands ? bands : s.band_block[1];
  const int k = pair / (block * m.pairs), j = pair - k * block * m.pairs;
  const int in_block = bands - k * block < block ? bands - k * block : block;
  const int band = k * block + j % in_block;
  const OwnBands own = own_bands(c, r, e, tm);
  const int remote_before = m.pairs * remote_bands(own, 0, k * block) + (j / in_block) * remote_bands(own, k * block, k * block + in_block) +
                            remote_bands(own, k * block, band);
  const bool is_remote = remote_bands(own, band, band + 1) == 1;
  const int pair_place = is_remote ? remote[e] + remote_before
                                   : remote[L] + (first[e] / 2 - remote[e]) + (pair - remote_before);
  *place = 2 * pair_place + mate;
  GemmTile tile;
  tile.layer = 1;
  tile.expert = e;
  tile.row_begin = entry.row_begin;
  tile.row_end = entry.row_begin + entry.rows;
  tile.col_begin = static_cast<std::int64_t>(entry.col_tile) * s.tile_n[1];
  tile.col_end = tile.col_begin + s.tile_n[1] < s.hidden ? tile.col_begin + s.tile_n[1] : s.hidden;
  tile.signal_flag = entry.rows > 0 ? static_cast<std::int32_t>(m.band_flag) + entry.flag : kNoFlag;
  tile.wait_begin = static_cast<std::uint32_t>(W);  // all of GEMM0 (which has tiles: the rows are the same)
  tile.wait_count = 1;
  return tile;
}

// Piece `q` of the band at place `b`: its rows of source rank q (maybe none), back where they
// land in q's CombineIn, each raising its arrival flag there; after the bands of b's segment.
TILEMOE_HOST_DEVICE inline Segment tile_signal_piece(const StepCounts& c, const SequentialShape& s, const TileSignalSummary& m,
                                                     const int* prefix, int bands_per_segment, int b, int q) {
  const int L = c.local_experts, r = s.rank;
  const PlanBand band = tile_signal_band(c, s, m, prefix, b);
  const int block = c.block_row(r, band.expert, q), block_end = block + c.count(q, r * L + band.expert);
  const int lo = band.row_begin > block ? band.row_begin : block;
  const int hi = band.row_begin + band.rows < block_end ? band.row_begin + band.rows : block_end;
  Segment segment;
  segment.src = BufferId::ExpertOut;
  segment.dst = BufferId::CombineIn;
  segment.dest_rank = q;
  segment.rows = hi > lo ? hi - lo : 0;
  segment.src_row = hi > lo ? lo : band.row_begin;  // an empty piece still names its band
  segment.dst_row = c.offset_of(q, r * L + band.expert) + (hi > lo ? lo - block : 0);
  segment.col_begin = 0;
  segment.col_end = s.hidden;
  const int first = b - b % bands_per_segment;
  segment.wait_begin = m.band_wait + static_cast<std::uint32_t>(first);
  segment.wait_count = static_cast<std::uint32_t>(m.bands - first < bands_per_segment ? m.bands - first : bands_per_segment);
  segment.dest_flag = static_cast<std::int32_t>(tile_signal_row_arrival_flag(c, s, q) + segment.dst_row);
  segment.flag_per_row = 1;
  return segment;
}

// Wait `w` of the plan.
TILEMOE_HOST_DEVICE inline FlagWait tile_signal_wait(const StepCounts& c, const SequentialShape& s, const TileSignalSummary& m,
                                                     const int* prefix, std::uint32_t w) {
  const int W = c.world;
  const auto u = [](std::int64_t v) { return static_cast<std::uint32_t>(v); };
  if (w < u(W)) return source_rows_wait(c, s, static_cast<int>(w));
  if (w < m.band_wait) return FlagWait{u(W), u(m.seq.real_tiles[0]), s.rank};
  if (w >= m.received_wait) {
    return received_wait(c, DispatchOrder::Ascending, s.rank, static_cast<int>(w - m.received_wait),
                         [W](int, int q) { return tile_signal_received_flag(W, q); });
  }
  const PlanBand band = tile_signal_band(c, s, m, prefix, static_cast<int>(w - m.band_wait));
  return FlagWait{m.band_flag + u(band.id), u(sequential_column_tiles(s, 1)), s.rank};
}

// The most bands of a rank's rows: a partial band per expert at most.
TILEMOE_HOST_DEVICE inline std::int64_t tile_signal_max_bands(std::int64_t max_rows, int local_experts, std::int64_t tile_m) {
  return max_rows / tile_m + local_experts;
}
// Where the pieces start in the segments table (after the dispatch's segments); the pieces of
// bands_per_segment consecutive bands (x W) share their waits.
TILEMOE_HOST_DEVICE inline int tile_signal_first_piece(int world, int local_experts, DispatchVolume dispatch) {
  return dispatch_segment_count(world, local_experts, dispatch);
}

// Room for any step (as sequential_capacity): the band waits and each band's W pieces besides.
inline PlanCapacity tile_signal_capacity(int world, int local_experts, std::int64_t max_rows, std::int64_t max_tokens,
                                         const SequentialShape& shape) {
  const std::int64_t bands = tile_signal_max_bands(max_rows, local_experts, shape.tile_m);
  const std::int64_t tiles = (max_rows / shape.tile_m + 2LL * local_experts) *
                             (sequential_column_tiles(shape, 0) + 1 + sequential_column_tiles(shape, 1) + 1);
  const std::int64_t combines = ceil_div64(max_tokens, shape.combine_tokens);
  const std::int64_t segments = dispatch_segment_count(world, local_experts, shape.dispatch) + bands * world;
  const std::int64_t waits = world + 1 + bands + received_wait_count(world, shape.dispatch);
  return checked_capacity({local_experts, waits, tiles, segments, combines, tiles + combines, segments});
}

// Lane `lane` of `lanes` writes entries lane, lane + lanes, ... of every table (as
// compile_sequential_tables); `prefix` (tile_signal_prefix) is complete before any lane starts.
TILEMOE_HOST_DEVICE inline void compile_tile_signal_tables(const StepCounts& c, const TileSignalShape& shape, const int* prefix,
                                                           PlanTables& out, int lane = 0, int lanes = 1) {
  const SequentialShape& s = shape.gemm;
  const int W = c.world, L = c.local_experts, r = s.rank;
  const TileSignalSummary m = summarize_tile_signal(c, s, prefix);
  const std::int64_t gemm0 = m.seq.layer_tiles[0], tiles = gemm0 + m.seq.layer_tiles[1];
  const std::int64_t dispatch = tile_signal_first_piece(W, L, s.dispatch), segments = dispatch + 1LL * m.bands * W;
  const std::int64_t combines = ceil_div64(s.tokens, s.combine_tokens);
  const PlanSize size = plan_size(out, L, m.waits, tiles, segments, combines);
  const bool* fits = size.fits;
  const bool rows_fit = sequential_rows_fit(c, s);
  if (rows_fit && fits[kTilesTable] && fits[kComputeQueueTable]) {
    for (std::int64_t i = lane; i < tiles; i += lanes) {
      if (i < gemm0) {
        out.tiles.data[i] = sequential_tile(c, s, m.seq, prefix, i);
      } else {
        int place = 0;
        const GemmTile tile = tile_signal_gemm1_tile(c, s, m, prefix, static_cast<int>(i - gemm0), &place);
        out.tiles.data[gemm0 + place] = tile;
      }
      out.compute_queue.data[i] = TaskRef{TaskKind::Gemm, static_cast<std::uint32_t>(i)};
    }
  }
  if (fits[kCombinesTable] && fits[kComputeQueueTable]) {  // each chunk once its rows have landed
    for (std::int64_t i = lane; i < combines; i += lanes) {
      CombineTask task = token_chunk(s, i);
      task.waits_for_rows = 1;
      out.combines.data[i] = task;
      out.compute_queue.data[tiles + i] = TaskRef{TaskKind::Combine, static_cast<std::uint32_t>(i)};
    }
  }
  if (rows_fit && fits[kSegmentsTable] && fits[kCommQueueTable]) {
    for (std::int64_t j = lane; j < segments; j += lanes) {
      out.segments.data[j] = j < dispatch ? tile_signal_dispatch_segment(c, s, m, static_cast<int>(j))
                                          : tile_signal_piece(c, s, m, prefix, shape.bands_per_segment,
                                                              static_cast<int>((j - dispatch) / W), static_cast<int>((j - dispatch) % W));
      out.comm_queue.data[j] = TaskRef{TaskKind::Segment, static_cast<std::uint32_t>(j)};
    }
  }
  if (rows_fit && fits[kWaitsTable]) {
    for (std::uint32_t w = static_cast<std::uint32_t>(lane); w < m.waits; w += static_cast<std::uint32_t>(lanes)) {
      out.waits.data[w] = tile_signal_wait(c, s, m, prefix, w);
    }
  }
  write_local_experts(c, r, size, out, lane, lanes);
  if (lane != 0 || !finish_rank_plan(c, s, size, rows_fit, out)) return;
  PlanHeader& h = out.header;
  h.flag_count = m.flag_count;
  h.row_arrival_flag = m.row_arrival_flag;
  h.layer_tiles[0] = static_cast<std::uint32_t>(m.seq.layer_tiles[0]);
  h.layer_tiles[1] = static_cast<std::uint32_t>(m.seq.layer_tiles[1]);
}

}  // namespace tilemoe::plan_detail
