#include "cost_model.hpp"

#include <algorithm>
#include <vector>

#include "tilemoe/error.hpp"

namespace tilemoe {

CometCost comet_cost(const CometCostProblem& p, const GpuRates& r) {
  if (r.gemm_flops_per_sm <= 0.0 || r.copy_bytes_per_cta <= 0.0) throw_bad_input("comet's cost model: the calibrated rates must be positive");
  if (p.sms < 1 || p.gemm0_sms < 1 || p.gemm0_sms > p.sms || p.gemm1_sms < 1 || p.gemm1_sms > p.sms || p.splits < 1 || p.world < 2 ||
      p.dispatch_ctas < 1 || p.send_ctas < 1 || p.sequential_ctas <= 0.0 || p.gemm0_flops < 0.0 || p.gemm1_flops < 0.0 ||
      p.dispatch_bytes < 0.0 || p.combine_bytes < 0.0 || p.local_bytes_per_source < 0.0) {
    throw_bad_input("comet's cost model: a problem needs a world of two or more, SMs for the GEMMs, CTAs for the exchange, "
                    "a split or more and non-negative work");
  }
  const auto gemm = [&](double flops, int sms) { return flops / (r.gemm_flops_per_sm * sms); };
  const auto copy = [&](double bytes, double ctas, bool over_link) {
    double rate = ctas * r.copy_bytes_per_cta;
    if (over_link && p.link_bytes_per_s > 0.0) rate = std::min(rate, p.link_bytes_per_s);
    return bytes / rate;
  };
  CometCost cost;
  cost.sequential_ms = 1e3 * (gemm(p.gemm0_flops, p.sms) + gemm(p.gemm1_flops, p.sms) + copy(p.dispatch_bytes, p.sequential_ctas, true) +
                              copy(p.combine_bytes, p.sequential_ctas, true));
  const double g0 = gemm(p.gemm0_flops, p.gemm0_sms), g1 = gemm(p.gemm1_flops, p.gemm1_sms);
  // layer 0 a source at a time (above): when each lands, is placed, and is through GEMM0
  const int W = p.world, placers = std::max(1, p.dispatch_ctas - 1);
  const double send = copy(p.dispatch_bytes, 1, true) / (W - 1), place = copy(p.local_bytes_per_source, 1, false), gemm0 = g0 / W;
  const bool one_cta = p.dispatch_ctas == 1;
  std::vector<double> placer_free(static_cast<std::size_t>(placers), 0.0);
  double gemm0_done = 0.0;
  for (int i = 0; i < W; ++i) {
    double in_place = 0.0;
    if (i == 0) {  // the own rows, by the one CTA or the first placer
      in_place = placer_free[0] = place;
    } else if (!p.places_arrivals) {  // they land in place
      in_place = (one_cta ? place : 0.0) + i * send;
    } else if (one_cta) {  // own rows, every send, then the sources in turn
      in_place = place + (W - 1) * send + i * place;
    } else {
      double& free = placer_free[static_cast<std::size_t>(i % placers)];
      in_place = free = std::max(free, i * send) + place;
    }
    gemm0_done = std::max(gemm0_done, in_place) + gemm0;
  }
  cost.layer0_ms = 1e3 * gemm0_done;
  const double c = copy(p.combine_bytes, std::min(p.send_ctas, p.world - 1), true);
  cost.layer1_ms = 1e3 * std::max(g1 + c / p.splits, c + g1 / p.splits);
  cost.comet_ms = cost.layer0_ms + cost.layer1_ms;
  return cost;
}

}  // namespace tilemoe
