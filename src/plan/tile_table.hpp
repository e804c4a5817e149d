#pragma once
// The order of a grouped GEMM's tiles, decoded entry by entry from the groups' row offsets: one
// function that the planned GEMM's table builder runs on the device (a thread per entry, right
// after the layout) and the plan compilers run on the host, so the two cannot disagree.
//
// The sequential order: group after group, inside a group N tile after N tile, the M tiles (row
// bands of tile_m rows from the group's first row) fastest, cluster mates adjacent. PerTile
// numbers flags by entry; PerBand gives all tiles of one row band one flag (it reaches the
// band's N tiles per run), bands numbered in row order across groups. band_block > 0 (even)
// orders each group in blocks of that many bands instead, block after block with the same order
// inside a block: a block's band flags complete after its entries, so a consumer of bands can
// start after one block rather than after nearly the whole group (the weights are then read
// once per block, not once per group). A mate past its group's tiles is padding: a copy of its
// partner with rows = 0 (the cluster's multicast operand stays the same), which computes and
// stores nothing.
#include <cstdint>
#include <vector>

#include "core/host_device.hpp"
#include "plan/gpu_tables.hpp"
#include "tilemoe/plan.hpp"

namespace tilemoe::cuda {

struct GroupTiles {
  int m_tiles = 0;  // row bands of tile_m rows
  int entries = 0;  // table entries, cluster padding included
};

TILEMOE_HOST_DEVICE inline int tile_ceil_div(int a, int b) { return (a + b - 1) / b; }

TILEMOE_HOST_DEVICE inline GroupTiles group_tiles(int rows, int n_tiles, PlannedCluster cluster, int tile_m) {
  GroupTiles t;
  if (rows <= 0) return t;
  t.m_tiles = tile_ceil_div(rows, tile_m);
  t.entries = cluster == PlannedCluster::M2   ? 2 * tile_ceil_div(t.m_tiles, 2) * n_tiles
              : cluster == PlannedCluster::N2 ? t.m_tiles * 2 * tile_ceil_div(n_tiles, 2)
                                              : t.m_tiles * n_tiles;
  return t;
}

// Entry `local` of group g (rows [begin, begin + rows)); `band0` = the group's first band id.
TILEMOE_HOST_DEVICE inline GemmTileEntry decode_block_entry(int g, int begin, int rows, int band0, int local, int index,
                                                            int n_tiles, PlannedCluster cluster, TileFlags flags, int tile_m) {
  const GroupTiles t = group_tiles(rows, n_tiles, cluster, tile_m);
  const int pair = local / 2, mate = local % 2;
  int m = 0, n = 0;
  bool real = true;
  if (cluster == PlannedCluster::None) {
    m = local % t.m_tiles;
    n = local / t.m_tiles;
  } else if (cluster == PlannedCluster::M2) {
    const int m_pairs = tile_ceil_div(t.m_tiles, 2);
    n = pair / m_pairs;
    m = 2 * (pair % m_pairs) + mate;
    if (m >= t.m_tiles) { real = false; m -= 1; }
  } else {
    m = pair % t.m_tiles;
    n = 2 * (pair / t.m_tiles) + mate;
    if (n >= n_tiles) { real = false; n -= 1; }
  }
  GemmTileEntry e;
  e.group = g;
  e.row_begin = begin + m * tile_m;
  e.rows = real ? (rows - m * tile_m < tile_m ? rows - m * tile_m : tile_m) : 0;
  e.col_tile = n;
  e.flag = !real || flags == TileFlags::None ? -1 : (flags == TileFlags::PerTile ? index : band0 + m);
  return e;
}

// Entry `local` of group g with the group's bands in blocks of `band_block` (0: one block):
// block after block, each block decoded as a group of its own. Blocks are even (a 2x1
// cluster's pairs never straddle two), so the entry count is the same.
TILEMOE_HOST_DEVICE inline GemmTileEntry decode_entry(int g, int begin, int rows, int band0, int local, int index, int n_tiles,
                                                      PlannedCluster cluster, TileFlags flags, int band_block, int tile_m) {
  const GroupTiles t = group_tiles(rows, n_tiles, cluster, tile_m);
  if (band_block <= 0 || band_block >= t.m_tiles) {
    return decode_block_entry(g, begin, rows, band0, local, index, n_tiles, cluster, flags, tile_m);
  }
  const int per_block = group_tiles(band_block * tile_m, n_tiles, cluster, tile_m).entries;
  const int block = local / per_block;
  const int first_band = block * band_block;
  const int left = rows - first_band * tile_m;
  const int block_rows = left < band_block * tile_m ? left : band_block * tile_m;
  return decode_block_entry(g, begin + first_band * tile_m, block_rows, band0 + first_band, local - block * per_block, index,
                            n_tiles, cluster, flags, tile_m);
}

// A plan's GEMM tile in the table's terms (what the planned GEMM reads when it walks a plan):
// its expert is the group, its columns one output tile of `out_tile_cols` columns (256, or 128
// for SwiGLU's GEMM0), its signal_flag the flag; a tile of no rows is a padding mate.
TILEMOE_HOST_DEVICE inline GemmTileEntry entry_of_tile(const GemmTile& tile, int out_tile_cols) {
  GemmTileEntry e;
  e.group = tile.expert;
  e.row_begin = static_cast<int>(tile.row_begin);
  e.rows = static_cast<int>(tile.row_end - tile.row_begin);
  e.col_tile = static_cast<int>(tile.col_begin / out_tile_cols);
  e.flag = tile.signal_flag;
  return e;
}

// The whole table on the host, groups from row_offset [groups + 1], `n_cols` GEMM columns in
// tiles of tile_n. Bad input for a band block that is not 0 or positive and even, or offsets
// that decrease.
std::vector<GemmTileEntry> build_tile_table(const std::vector<int>& row_offset, int n_cols, PlannedCluster cluster,
                                            TileFlags flags, int band_block = 0, int tile_m = kPlannedTileM,
                                            int tile_n = kPlannedTileN);
void check_band_block(int band_block);

}  // namespace tilemoe::cuda
