#include "cost_model.hpp"

#include <algorithm>

#include "tilemoe/error.hpp"

namespace tilemoe {

CometCost comet_cost(const CometCostProblem& p, const GpuRates& r) {
  if (r.gemm_flops_per_sm <= 0.0 || r.copy_bytes_per_cta <= 0.0) throw_bad_input("comet's cost model: the calibrated rates must be positive");
  if (p.sms < 1 || p.gemm_sms < 1 || p.gemm_sms > p.sms || p.splits < 1 || p.world < 2 || p.dispatch_ctas <= 0.0 ||
      p.combine_ctas <= 0.0 || p.sequential_ctas <= 0.0 || p.gemm0_flops < 0.0 || p.gemm1_flops < 0.0 || p.dispatch_bytes < 0.0 || p.combine_bytes < 0.0) {
    throw_bad_input("comet's cost model: a problem needs a world of two or more, SMs for the GEMMs, CTAs for the exchange, "
                    "a split or more and non-negative work");
  }
  const auto gemm = [&](double flops, int sms) { return flops / (r.gemm_flops_per_sm * sms); };
  const auto exchange = [&](double bytes, double ctas) {
    double rate = ctas * r.copy_bytes_per_cta;
    if (p.link_bytes_per_s > 0.0) rate = std::min(rate, p.link_bytes_per_s);
    return bytes / rate;
  };
  const double sequential = gemm(p.gemm0_flops, p.sms) + gemm(p.gemm1_flops, p.sms) + exchange(p.dispatch_bytes, p.sequential_ctas) +
                            exchange(p.combine_bytes, p.sequential_ctas);
  const double g0 = gemm(p.gemm0_flops, p.gemm_sms), g1 = gemm(p.gemm1_flops, p.gemm_sms);
  const double d = exchange(p.dispatch_bytes, p.dispatch_ctas), c = exchange(p.combine_bytes, p.combine_ctas);
  const double layer0 = std::max(g0, d + g0 / p.world);
  const double layer1 = std::max(g1 + c / p.splits, c + g1 / p.splits);
  return CometCost{1e3 * (layer0 + layer1), 1e3 * sequential};
}

}  // namespace tilemoe
