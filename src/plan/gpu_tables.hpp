#pragma once
// The planned GEMM's tile table entry and tiling. The layer's GEMMs walk plans (a plan's
// GemmTile read as an entry: tile_table.hpp's entry_of_tile); tables of entries remain the
// planned GEMM's own input in its tests and benchmarks, and the form the tile order is decoded
// in on either side (tile_table.hpp).
#include <cstdint>

namespace tilemoe::cuda {

// The planned GEMM's tile: 128 rows x 256 GEMM columns.
constexpr int kPlannedTileM = 128;
constexpr int kPlannedTileN = 256;

// The planned GEMM's clusters: pairs of CTAs that share one operand by TMA multicast.
enum class PlannedCluster { M2,  // 2x1: mates share B, take M-adjacent tiles (many rows per expert)
                            N2,  // 1x2: mates share A, take N-adjacent tiles
                            None };  // no mates: the tile order of N2 without its padding (the CPU
                                     // engine's plans; the planned GEMM itself runs on pairs only)

// Which flags a tile table's entries raise: none, one per entry, or one per row band (all the
// band's column tiles count into it).
enum class TileFlags { None, PerTile, PerBand };

// One 128 x 256 tile of the planned GEMM (src/kernels/gemm/planned/planned_gemm.hpp): rows
// [row_begin, row_begin + rows) of the group's A rows, GEMM columns [256 * col_tile, +256);
// after its store it adds 1 to flags[flag] (-1: none).
struct GemmTileEntry {
  std::int32_t group = 0;
  std::int32_t row_begin = 0;
  std::int32_t rows = 0;      // 0..128 (0: a cluster mate's padding, computes and stores nothing)
  std::int32_t col_tile = 0;  // GEMM columns [256 * col_tile, +256)
  std::int32_t flag = -1;
};
static_assert(sizeof(GemmTileEntry) == 20);

}  // namespace tilemoe::cuda
