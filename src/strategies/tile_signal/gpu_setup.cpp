#include "gpu_setup.hpp"

#include <algorithm>
#include <cstdio>

#include "defaults.hpp"
#include "plan/gpu_tables.hpp"
#include "split_model.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

constexpr double kOverlapMargin = 0.03;  // auto overlaps only where the model sees a 3% win

int column_tiles(const TileSignalGpuShape& s) { return static_cast<int>((s.hidden + kPlannedTileN - 1) / kPlannedTileN); }

}  // namespace

TileSignalSplit choose_tile_signal_split(const TileSignalGpuShape& s, const TileSignalOptions& options, bool auto_strategy,
                                         const std::function<const GpuRates&()>& rates) {
  TileSignalSplit split;
  split.consumer_ctas = options.consumer_ctas;
  if (!auto_strategy && options.consumer_ctas != 0) return split;
  // the cost model, for the layer's shape under balanced routing: each rank receives about
  // tokens x top_k rows, (world - 1) / world of them from other ranks
  const double rows = static_cast<double>(s.tokens * s.top_k);
  SplitProblem problem;
  problem.gemm1_flops = 2.0 * rows * static_cast<double>(s.hidden) * static_cast<double>(s.ffn_hidden);
  problem.remote_bytes = rows * (s.world - 1) / s.world * static_cast<double>(s.hidden) * 2.0;
  problem.link_bytes_per_s = s.link_bytes_per_s;
  problem.bands = std::max(1, static_cast<int>(rows / kPlannedTileM));
  problem.column_tiles = column_tiles(s);
  problem.sms = std::max(3, s.sm_count / s.sharing);  // ranks sharing the SMs share the GEMM rate too
  // a consumer CTA takes a whole SM from GEMM1 (its registers block the GEMM's CTA there), so
  // the budget is in SMs: all sharing ranks' consumers together at most half of them
  const int most = std::max(2, std::min(32, s.sm_count / (2 * s.sharing)));
  const SplitChoice choice = choose_split(problem, rates(), 2, most, kOverlapMargin, 2);  // even: clusters of 2
  split.overlap = !auto_strategy || choice.overlap;
  split.consumer_ctas = choice.overlap ? choice.consumer_ctas : choice.best_ctas;
  split.chosen_by_model = true;
  char note[160];
  std::snprintf(note, sizeof note, "model %.3f ms at c=%d vs sequential %.3f ms", choice.overlap ? choice.predicted_ms : 0.0,
                split.consumer_ctas, choice.sequential_ms);
  split.note = std::string(auto_strategy ? "auto: " : "") + note;
  return split;
}

TileSignalGpuSchedule tile_signal_gpu_schedule(const TileSignalGpuShape& s, const TileSignalOptions& options, int consumer_ctas) {
  TileSignalGpuSchedule schedule;
  schedule.bands_per_segment = gpu_bands_per_segment(options);
  if (consumer_ctas < 2 || consumer_ctas % 2 != 0 || schedule.bands_per_segment > kMaxBandsPerSegment ||
      options.bands_per_segment < 0) {
    throw_bad_input("tile_signal: consumer CTAs must be even (clusters of 2, like GEMM1's; 0 = the cost model's) and bands "
                    "per segment 1.." + std::to_string(kMaxBandsPerSegment) + " (0 = the strategy's)");
  }
  // a consumer CTA keeps GEMM1 off its SM. A rank with SMs of its own leaves GEMM1 one cluster
  // at least (2 SMs); ranks sharing SMs give all their consumers together at most half of them
  // (beside them wait the peers' exchange kernels), and GEMM1 runs on the rest
  if (s.sharing == 1 && consumer_ctas > s.sm_count - 2) {
    throw_bad_input(std::to_string(consumer_ctas) + " consumer CTAs leave GEMM1 less than one 2-SM cluster of the " +
                    std::to_string(s.sm_count) + " SMs");
  }
  if (s.sharing > 1 && (consumer_ctas * s.sharing > s.sm_count / 2 || consumer_ctas * s.sharing > s.resident_exchange_ctas / 2)) {
    throw_bad_input(std::to_string(consumer_ctas) + " consumer CTAs x " + std::to_string(s.sharing) +
                    " rank(s) sharing these SMs would take more than half of the " + std::to_string(s.sm_count) +
                    " SMs from GEMM1");
  }
  if (options.band_block < 0 || options.band_block % 2 != 0) {
    throw_bad_input("tile_signal: band_block must be 0 (the strategy's) or a positive even number");
  }
  schedule.consumer_ctas = consumer_ctas;
  schedule.gemm1_sm_limit = s.sm_count - consumer_ctas * s.sharing;
  schedule.band_block = options.band_block > 0 ? options.band_block : default_band_block(schedule.gemm1_sm_limit, column_tiles(s));
  return schedule;
}

}  // namespace tilemoe::cuda
