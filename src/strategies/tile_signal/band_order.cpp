#include "band_order.hpp"

#include <algorithm>
#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

TileSignalTables tile_signal_tables(const std::vector<int>& row_offset, const std::vector<int>& block_offset, int world, int me,
                                    int n_cols, int band_block, int tile_m, int tile_n) {
  const int groups = static_cast<int>(row_offset.size()) - 1;
  if (groups < 1 || block_offset.size() != static_cast<std::size_t>(groups * world + 1)) {
    throw_bad_input("tile_signal tables: " + std::to_string(block_offset.size()) + " block offsets for " +
                    std::to_string(groups) + " groups x " + std::to_string(world) + " ranks (+1)");
  }
  TileSignalTables t;
  auto remote = [&](int g, int lo, int hi) { return holds_remote_rows(block_offset.data(), g, world, me, lo, hi); };

  // GEMM1: the sequential table's cluster items (pairs), those holding remote rows first
  const std::vector<GemmTileEntry> table = build_tile_table(row_offset, n_cols, PlannedCluster::N2, TileFlags::PerBand,
                                                            band_block, tile_m, tile_n);
  std::vector<std::size_t> items(table.size() / 2);
  for (std::size_t i = 0; i < items.size(); ++i) items[i] = i;
  auto item_remote = [&](std::size_t item) {
    for (std::size_t j = 0; j < 2; ++j) {
      const GemmTileEntry& e = table[2 * item + j];
      if (e.rows > 0 && remote(e.group, e.row_begin, e.row_begin + e.rows)) return true;
    }
    return false;
  };
  std::stable_partition(items.begin(), items.end(), item_remote);
  for (std::size_t item : items) {
    t.gemm1.push_back(table[2 * item]);
    t.gemm1.push_back(table[2 * item + 1]);
  }

  // the bands in row order, numbered as the table's band flags, those holding remote rows first
  for (int g = 0, id = 0; g < groups; ++g) {
    for (int begin = row_offset[g]; begin < row_offset[g + 1]; begin += tile_m, ++id) {
      TileBand band;
      band.row_begin = begin;
      band.rows = std::min(tile_m, row_offset[g + 1] - begin);
      band.id = id;
      band.group = g;
      band.remote = remote(g, begin, begin + band.rows) ? 1 : 0;
      t.bands.push_back(band);
    }
  }
  std::stable_partition(t.bands.begin(), t.bands.end(), [](const TileBand& b) { return b.remote != 0; });
  return t;
}

}  // namespace tilemoe::cuda
