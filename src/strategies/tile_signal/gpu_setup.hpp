#pragma once
// tile_signal's decisions for one rank's layer on the GPU, taken once when the layer is built:
// whether `auto` overlaps at all, how many CTAs the band consumer gets (and so how many SMs
// GEMM1 keeps), how GEMM1's table is cut into band blocks, and how many bands a segment ships.
// The layer asks and obeys; the rules and their reasons live here.
#include <cstdint>
#include <functional>
#include <string>

#include "tilemoe/gpu_rates.hpp"
#include "tilemoe/strategy_options.hpp"

namespace tilemoe::cuda {

// What the layer knows of the rank's step and GPU.
struct TileSignalGpuShape {
  std::int64_t tokens = 0;  // the most tokens a rank forwards per step
  std::int64_t top_k = 1, hidden = 0, ffn_hidden = 0;
  int world = 1;
  int sm_count = 0;                // SMs the rank's kernels run on
  int sharing = 1;                 // ranks sharing those SMs (virtual ranks)
  int resident_exchange_ctas = 0;  // exchange CTAs that fit on those SMs at once
  double link_bytes_per_s = 0.0;   // the rank's outgoing link; 0 = not the limit
};

// The split of the SMs between GEMM1 and the consumer.
struct TileSignalSplit {
  bool overlap = true;           // false: `auto` runs the sequential strategy
  int consumer_ctas = 0;
  bool chosen_by_model = false;  // the cost model picked it (so every rank takes rank 0's pick)
  std::string note;              // how it was chosen, for the layer's description
};

// `auto_strategy`: overlap only where the cost model sees the split win (by 3%); otherwise
// tile_signal with options.consumer_ctas, or the model's best split when that is 0. `rates` is
// called only when the model is needed (it may calibrate the GPU).
TileSignalSplit choose_tile_signal_split(const TileSignalGpuShape& shape, const TileSignalOptions& options, bool auto_strategy,
                                         const std::function<const GpuRates&()>& rates);

// The most bands one consumer unit waits for: a unit ships nothing until all of them are ready,
// so larger units only delay the first rows (the sweep tried 1 and 2: BENCHMARKS.md).
constexpr int kMaxBandsPerSegment = 32;

// GEMM1's side of a split the ranks agreed on.
struct TileSignalGpuSchedule {
  int consumer_ctas = 0;
  int gemm1_sm_limit = 0;     // SMs GEMM1 may use; the others are the consumers'
  int band_block = 0;         // GEMM1's table in blocks of this many bands (build_tile_table)
  int bands_per_segment = 1;  // bands the consumer ships as one segment
};

// Bad input, saying what to change, for a split that cannot run: odd consumer CTAs (they
// launch in clusters of 2), too many for the SMs, bands per segment outside 1..32, an odd band
// block.
TileSignalGpuSchedule tile_signal_gpu_schedule(const TileSignalGpuShape& shape, const TileSignalOptions& options,
                                               int consumer_ctas);

}  // namespace tilemoe::cuda
