#include "gpu_setup.hpp"

#include <algorithm>

#include "plan/gpu_tables.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

int comet_exchange_ctas_per_peer(int sm_count, int sharing, int resident_ctas_per_sm, int world) {
  const int sms = sm_count / (8 * std::max(1, sharing));
  const int fit = resident_ctas_per_sm * sm_count / std::max(1, sharing * world);
  return std::max(1, std::min(fit, sms * resident_ctas_per_sm / std::max(1, world)));
}

std::int64_t comet_gpu_split_cols(std::int64_t hidden, const CometOptions& options) {
  constexpr std::int64_t kPair = 2 * kPlannedTileN;
  if (options.split_cols < 0 || options.split_cols % kPlannedTileN != 0) {
    throw_bad_input("comet on the GPU: split_cols must be 0 (a quarter of hidden) or a positive multiple of " +
                    std::to_string(kPlannedTileN) + " (the GEMM's tile width), not " + std::to_string(options.split_cols));
  }
  const std::int64_t quarter = (hidden + 3) / 4;
  return options.split_cols > 0 ? options.split_cols : std::max(kPair, (quarter + kPair - 1) / kPair * kPair);
}

CometGpuSchedule comet_gpu_schedule(const CometGpuShape& s, const CometOptions& options) {
  CometGpuSchedule schedule;
  schedule.split_cols = comet_gpu_split_cols(s.hidden, options);
  // an exchange CTA keeps a GEMM off its SM (their registers do not fit together): ranks sharing
  // the SMs each leave their exchange's SMs free (the dispatch's and the splits' sends are grids of
  // the same size)
  const int per_sm = std::max(1, s.dispatch_ctas_per_sm);
  const int dispatch_sms = (s.dispatch_ctas + per_sm - 1) / per_sm;
  schedule.gemm_sm_limit = (s.sm_count - dispatch_sms * std::max(1, s.sharing)) / 2 * 2;
  if (schedule.gemm_sm_limit < 2) {
    throw_bad_input("comet: the dispatch's " + std::to_string(s.dispatch_ctas) + " CTAs x " + std::to_string(std::max(1, s.sharing)) +
                    " rank(s) leave the GEMMs less than one 2-SM cluster of the " + std::to_string(s.sm_count) +
                    " SMs: use fewer exchange CTAs per peer, or another strategy");
  }
  schedule.note = "GEMMs on " + std::to_string(schedule.gemm_sm_limit) + " SMs beside the exchange, GEMM1 in splits of " +
                  std::to_string(schedule.split_cols) + " columns";
  return schedule;
}

}  // namespace tilemoe::cuda
