#include "tile_table.hpp"

#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

void check_band_block(int band_block) {
  if (band_block < 0 || band_block % 2 != 0) {
    throw_bad_input("tile table: band blocks of " + std::to_string(band_block) + " bands (0 or a positive even number)");
  }
}

std::vector<GemmTileEntry> build_tile_table(const std::vector<int>& row_offset, int n_cols, PlannedCluster cluster,
                                            TileFlags flags, int band_block, int tile_m, int tile_n) {
  if (row_offset.size() < 2) throw_bad_input("tile table: row_offset needs groups + 1 entries");
  if (tile_m < 1 || tile_n < 1 || n_cols < 1) throw_bad_input("tile table: tiles and columns must be positive");
  check_band_block(band_block);
  const int n_tiles = tile_ceil_div(n_cols, tile_n);
  std::vector<GemmTileEntry> table;
  int band0 = 0;
  for (std::size_t g = 0; g + 1 < row_offset.size(); ++g) {
    const int begin = row_offset[g], rows = row_offset[g + 1] - begin;
    if (rows < 0) throw_bad_input("tile table: row_offset decreases at group " + std::to_string(g));
    const GroupTiles t = group_tiles(rows, n_tiles, cluster, tile_m);
    for (int local = 0; local < t.entries; ++local) {
      table.push_back(decode_entry(static_cast<int>(g), begin, rows, band0, local, static_cast<int>(table.size()), n_tiles,
                                   cluster, flags, band_block, tile_m));
    }
    band0 += t.m_tiles;
  }
  return table;
}

}  // namespace tilemoe::cuda
