#pragma once
// tile_signal's choices where its options leave them to the strategy (0).
#include "tilemoe/strategy_options.hpp"

namespace tilemoe {

// Bands per consumer segment. On the CPU engine a segment is a task with its own overhead, so
// two; on the GPU one, the layer's default since its first cut (tile_signal_bench's sweep,
// BENCHMARKS.md, shows no consistent winner between 1 and 2).
inline int cpu_bands_per_segment(const TileSignalOptions& options) {
  return options.bands_per_segment > 0 ? options.bands_per_segment : 2;
}
inline int gpu_bands_per_segment(const TileSignalOptions& options) {
  return options.bands_per_segment > 0 ? options.bands_per_segment : 1;
}

// The band block of GEMM1's table (build_tile_table) when none is given: a band is ready after
// all its column tiles, which the sequential order (bands fastest, one column pair after the
// other) finishes near the end of its expert; blocks of about two waves of GEMM1's 2-CTA
// clusters (each item is half a band's column tiles) make bands ready one block at a time.
inline int default_band_block(int gemm1_sms, int column_tiles) {
  const int clusters = gemm1_sms / 2 > 1 ? gemm1_sms / 2 : 1;
  const int wanted = (4 * clusters + column_tiles - 1) / column_tiles;
  return wanted <= 2 ? 2 : (wanted + 1) / 2 * 2;
}

}  // namespace tilemoe
