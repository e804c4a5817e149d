#pragma once
// tile_signal's remote-first order (the paper's, systems.md 1.2) in its plainest form: GEMM1's
// table and the band list stably partitioned, bands holding other ranks' rows first, from the
// step's row tables. The compiler (tile_signal_plan.hpp) computes the same order in closed form
// an entry at a time; this is the reference the tests hold it against (and the tables the GPU
// built before it compiled plans, which bench/table_schedule.cu still builds for comparison).
#include <cstdint>
#include <vector>

#include "plan/gpu_tables.hpp"
#include "plan/tile_table.hpp"

namespace tilemoe::cuda {

// A row band of the local experts' rows: [row_begin, row_begin + rows), rows <= tile_m, ready
// when its flag `id` has counted every column tile of the band.
struct TileBand {
  std::int32_t row_begin = 0;
  std::int32_t rows = 0;
  std::int32_t remote = 0;  // holds rows of another rank (shipped first)
  std::int32_t id = 0;      // its flag: bands numbered in row order, as TileFlags::PerBand does
  std::int32_t group = 0;   // the local expert
};

// Whether rows [lo, hi) of local expert g hold rows of a rank other than `me`, by the split of
// its rows by source, block_offset [groups * world + 1] (row of block (g, q) = g * world + q).
TILEMOE_HOST_DEVICE inline bool holds_remote_rows(const int* block_offset, int g, int world, int me, int lo, int hi) {
  for (int q = 0; q < world; ++q) {
    if (q == me) continue;
    const int b = block_offset[g * world + q], e = block_offset[g * world + q + 1];
    if (b < e && lo < e && b < hi) return true;
  }
  return false;
}

struct TileSignalTables {
  std::vector<GemmTileEntry> gemm1;  // GEMM1's table (1x2 clusters, one flag per band): items holding remote rows first
  std::vector<TileBand> bands;       // every band, those holding remote rows first; id = its flag
};

// `row_offset` [groups + 1]: the local experts' rows; `block_offset` [groups * world + 1]: those
// rows split by source rank; GEMM1 over `n_cols` columns in tiles of tile_m x tile_n, each
// expert's bands in blocks of `band_block` (0: one block). Both orders are stable partitions of
// the sequential ones (build_tile_table's items, bands in row order).
TileSignalTables tile_signal_tables(const std::vector<int>& row_offset, const std::vector<int>& block_offset, int world, int me,
                                    int n_cols, int band_block, int tile_m = kPlannedTileM, int tile_n = kPlannedTileN);

}  // namespace tilemoe::cuda
