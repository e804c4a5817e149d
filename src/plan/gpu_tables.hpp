#pragma once
// The tables the GPU executors walk today: the planned GEMM's tile table and the band list of
// the tile-signal consumer. Strategies build them (on the device, right after the layout);
// executors only read them. They sit here, below kernels and executors, so that no executor
// includes a strategy; StepPlan's GemmTile and Segment are the host plan's form of the same
// facts, and the two are to become one format (NOTES.md, "One plan, two executors").
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

// The most bands one consumer segment ships: the band consumer holds a segment's bands in
// shared memory.
constexpr int kMaxBandsPerSegment = 32;

// A row band of the local experts' rows: [row_begin, row_begin + rows), rows <= 128, ready
// when its flag `id` has counted every column tile of the band.
struct TileBand {
  std::int32_t row_begin = 0;
  std::int32_t rows = 0;
  std::int32_t remote = 0;  // holds rows of another rank (shipped first)
  std::int32_t id = 0;      // its flag: bands numbered in row order, as TileFlags::PerBand does
  std::int32_t group = 0;   // the local expert
};

}  // namespace tilemoe::cuda
