// comet's cost model (src/strategies/comet/cost_model.hpp): the two layers' overlap as the GPU
// schedule runs it, against the sequential step, on rates like an H100's.
#include <gtest/gtest.h>

#include "strategies/comet/cost_model.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;

namespace {

GpuRates h100_like() {  // the rates a device call calibrated (2026-12-07)
  GpuRates r;
  r.gpu = "test GPU, 132 SMs";
  r.sms = 132;
  r.gemm_flops_per_sm = 5.1e12;
  r.copy_bytes_per_cta = 47.7e9;
  return r;
}

// DeepSeek-V3's layer at 4096 tokens per rank on 8 ranks of 16 SMs with 44.8 GB/s links
CometCostProblem deepseek_like() {
  CometCostProblem p;
  p.gemm0_flops = 1.924e12;
  p.gemm1_flops = 0.962e12;
  p.dispatch_bytes = 270e6;
  p.combine_bytes = 411e6;
  p.link_bytes_per_s = 44.8e9;
  p.world = 8;
  p.splits = 4;
  p.sms = 16;
  p.gemm_sms = 14;
  p.dispatch_ctas = 1;      // one destination at a time, a CTA per peer: 47.7 GB/s, over the link
  p.combine_ctas = 7;
  p.sequential_ctas = 7 * 4;
  return p;
}

double ms(double flops, int sms) { return 1e3 * flops / (5.1e12 * sms); }

}  // namespace

TEST(CometCost, BothTermsAsTheScheduleRunsThem) {
  const CometCostProblem p = deepseek_like();
  const CometCost c = comet_cost(p, h100_like());
  const double d = 1e3 * 270e6 / 44.8e9, cb = 1e3 * 411e6 / 44.8e9;  // both link-bound
  EXPECT_NEAR(c.sequential_ms, ms(p.gemm0_flops, 16) + ms(p.gemm1_flops, 16) + d + cb, 1e-9);
  const double g0 = ms(p.gemm0_flops, 14), g1 = ms(p.gemm1_flops, 14);
  EXPECT_NEAR(c.comet_ms, std::max(g0, d + g0 / 8) + std::max(g1 + cb / 4, cb + g1 / 4), 1e-9);
  EXPECT_LT(c.comet_ms, c.sequential_ms);  // GEMM-bound: the exchanges hide but for a split's
}

TEST(CometCost, NothingToHideMeansTheSmsItTakesAreALoss) {
  CometCostProblem p = deepseek_like();
  p.dispatch_bytes = p.combine_bytes = 0;
  const CometCost c = comet_cost(p, h100_like());
  EXPECT_NEAR(c.comet_ms, c.sequential_ms * 16 / 14, 1e-9);
}

TEST(CometCost, MoreSplitsShortenTheLastSplitsTail) {
  CometCostProblem p = deepseek_like();
  const double four = comet_cost(p, h100_like()).comet_ms;
  p.splits = 14;
  EXPECT_LT(comet_cost(p, h100_like()).comet_ms, four);
}

TEST(CometCost, ASlowExchangeIsTheLimit) {
  CometCostProblem p = deepseek_like();
  p.dispatch_ctas = p.combine_ctas = 0.125;  // 6 GB/s: far below the link and the GEMMs
  const CometCost c = comet_cost(p, h100_like());
  const double d = 1e3 * 270e6 / (0.125 * 47.7e9), cb = 1e3 * 411e6 / (0.125 * 47.7e9);
  EXPECT_NEAR(c.comet_ms, (d + ms(p.gemm0_flops, 14) / 8) + (cb + ms(p.gemm1_flops, 14) / 4), 1e-9);
  EXPECT_GT(c.comet_ms, c.sequential_ms);
}

TEST(CometCost, RefusesWhatMakesNoSense) {
  CometCostProblem p = deepseek_like();
  GpuRates r = h100_like();
  r.copy_bytes_per_cta = 0;
  EXPECT_THROW(comet_cost(p, r), Error);
  p.gemm_sms = 17;
  EXPECT_THROW(comet_cost(p, h100_like()), Error);
  p = deepseek_like();
  p.world = 1;
  EXPECT_THROW(comet_cost(p, h100_like()), Error);
  p = deepseek_like();
  p.splits = 0;
  EXPECT_THROW(comet_cost(p, h100_like()), Error);
}
