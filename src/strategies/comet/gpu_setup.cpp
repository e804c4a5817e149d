#include "gpu_setup.hpp"

#include <algorithm>
#include <cstdio>

#include "cost_model.hpp"
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

namespace {

// What the cost model needs of the shape, under balanced routing: each rank receives about
// tokens x top_k expert rows, and a token's top_k distinct experts miss a given rank's L with
// probability C(E - L, k) / C(E, k).
CometCostProblem cost_problem(const CometGpuShape& s, const CometGpuSchedule& schedule) {
  const double rows = static_cast<double>(s.tokens * s.top_k), row_bytes = 2.0 * static_cast<double>(s.hidden);
  const double remote = static_cast<double>(s.world - 1) / s.world;
  const std::int64_t local = s.experts / std::max(1, s.world);
  double miss = 1.0;
  for (std::int64_t i = 0; i < s.top_k; ++i) miss *= static_cast<double>(std::max<std::int64_t>(s.experts - local - i, 0)) / (s.experts - i);
  const double dispatch_rows = s.once_per_rank ? static_cast<double>(s.tokens) * s.world * (1.0 - miss) : rows;
  CometCostProblem p;
  p.gemm0_flops = 2.0 * rows * static_cast<double>(s.hidden) * 2.0 * static_cast<double>(s.ffn_hidden);  // gate and up
  p.gemm1_flops = 2.0 * rows * static_cast<double>(s.ffn_hidden) * static_cast<double>(s.hidden);
  p.dispatch_bytes = dispatch_rows * remote * row_bytes;
  p.combine_bytes = rows * remote * row_bytes;
  p.link_bytes_per_s = s.link_bytes_per_s;
  p.world = s.world;
  p.splits = static_cast<int>((s.hidden + schedule.split_cols - 1) / schedule.split_cols);
  p.sms = std::max(1, s.sm_count / std::max(1, s.sharing));  // ranks sharing the SMs share the GEMM rate too
  p.gemm_sms = std::max(1, std::min(p.sms, schedule.gemm_sm_limit / std::max(1, s.sharing)));
  // the copies to other ranks: the dispatch's one destination at a time (serial sends), the
  // splits' sends and the sequential exchange to all of them at once
  p.dispatch_ctas = schedule.serial_sends ? s.exchange_ctas_per_peer : (s.world - 1) * s.exchange_ctas_per_peer;
  p.combine_ctas = (s.world - 1) * s.exchange_ctas_per_peer;
  p.sequential_ctas = (s.world - 1) * s.sequential_ctas_per_peer;
  return p;
}

}  // namespace

CometGpuSchedule comet_gpu_schedule(const CometGpuShape& s, const CometOptions& options, const std::function<const GpuRates&()>& rates) {
  CometGpuSchedule schedule;
  schedule.split_cols = comet_gpu_split_cols(s.hidden, options);
  // an exchange CTA keeps a GEMM off its SM (a GEMM CTA takes the SM's whole register file), and
  // the block scheduler spreads a grid over idle SMs before it stacks CTAs on one: each exchange
  // CTA may sit on an SM of its own, so the GEMMs leave one SM per CTA, whatever an SM could hold
  // (the dispatch's and the splits' sends are grids of the same size; ranks sharing the SMs each
  // leave their own). Were the GEMMs given more, a grid of waiting sends spread over every SM
  // could keep GEMM1, which they wait for, from starting at all.
  const int exchange_ctas = s.world * s.exchange_ctas_per_peer;
  schedule.gemm_sm_limit = (s.sm_count - exchange_ctas * std::max(1, s.sharing)) / 2 * 2;
  if (schedule.gemm_sm_limit < 2) {
    throw_bad_input("comet: the exchange's " + std::to_string(exchange_ctas) + " CTAs x " + std::to_string(std::max(1, s.sharing)) +
                    " rank(s) leave the GEMMs less than one 2-SM cluster of the " + std::to_string(s.sm_count) +
                    " SMs: use fewer exchange CTAs per peer, or another strategy");
  }
  schedule.note = "GEMMs on " + std::to_string(schedule.gemm_sm_limit) + " SMs beside the exchange, GEMM1 in splits of " +
                  std::to_string(schedule.split_cols) + " columns";
  if (rates && s.world > 1 && s.tokens > 0) {
    const CometCost cost = comet_cost(cost_problem(s, schedule), rates());
    schedule.predicted_ms = cost.comet_ms;
    schedule.sequential_ms = cost.sequential_ms;
    char model[96];
    std::snprintf(model, sizeof model, "; model %.3f ms vs sequential %.3f ms", cost.comet_ms, cost.sequential_ms);
    schedule.note += model;
  }
  return schedule;
}

}  // namespace tilemoe::cuda
