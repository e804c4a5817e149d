// comet's cost model (src/strategies/comet/cost_model.hpp): the two layers' overlap as the GPU
// schedule runs it, against the sequential step, on rates like an H100's.
#include <gtest/gtest.h>

#include "strategies/comet/cost_model.hpp"
#include "refusal.hpp"
#include "strategies/comet/gpu_setup.hpp"
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
  p.local_bytes_per_source = 470e6 / 8;  // a dispatch once per rank: every source placed
  p.link_bytes_per_s = 44.8e9;
  p.world = 8;
  p.splits = 4;
  p.sms = 16;
  p.gemm0_sms = p.gemm1_sms = 14;
  p.dispatch_ctas = 2;  // a sender (47.7 GB/s: over the link) and a placer
  p.send_ctas = 1;
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
  // GEMM0-bound once the own rows are placed (a source's placement, 1.2 ms, is shorter than its GEMM0)
  const double place = 1e3 * 470e6 / 47.7e9 / 8, g0 = ms(p.gemm0_flops, 14), g1 = ms(p.gemm1_flops, 14);
  EXPECT_NEAR(c.layer0_ms, place + g0, 1e-9);
  EXPECT_NEAR(c.layer1_ms, std::max(g1 + cb / 4, cb + g1 / 4), 1e-9);
  EXPECT_NEAR(c.comet_ms, c.layer0_ms + c.layer1_ms, 1e-12);
  EXPECT_LT(c.comet_ms, c.sequential_ms);  // GEMM-bound: the exchanges hide but for a split's
}

TEST(CometCost, OneDispatchCtaPlacesOnlyAfterItsSends) {
  CometCostProblem p = deepseek_like();
  p.dispatch_ctas = 1;
  const double d = 1e3 * 270e6 / 44.8e9, place = 1e3 * 470e6 / 47.7e9 / 8, g0 = ms(p.gemm0_flops, 14) / 8;
  // the own rows' GEMM0 ends before the first source is placed: GEMM0 waits for it, then runs on
  EXPECT_NEAR(comet_cost(p, h100_like()).layer0_ms, 2 * place + d + 7 * g0, 1e-9);
  EXPECT_GT(comet_cost(p, h100_like()).layer0_ms, comet_cost(deepseek_like(), h100_like()).layer0_ms);
}

TEST(CometCost, PlacersKeepPaceWithTheLinkOrNot) {
  CometCostProblem p = deepseek_like();
  GpuRates slow = h100_like();
  slow.copy_bytes_per_cta = 6e9;  // a placer's source (9.8 ms) outlasts its GEMM0 (3.4 ms) and its send
  const double place = 1e3 * 470e6 / 6e9 / 8, g0 = ms(p.gemm0_flops, 14) / 8;
  EXPECT_NEAR(comet_cost(p, slow).layer0_ms, 8 * place + g0, 1e-9);  // one placer: placement-bound
  p.dispatch_ctas = 3;  // two in turn keep up with the sends (6.4 ms a source at 6 GB/s): the last lands, is placed, GEMM'd
  const double send = 1e3 * 270e6 / 6e9 / 7;
  EXPECT_NEAR(comet_cost(p, slow).layer0_ms, 7 * send + place + g0, 1e-9);
}

TEST(CometCost, RowsThatLandInPlaceNeedNoPlacer) {
  CometCostProblem p = deepseek_like();
  p.places_arrivals = false;  // a row per expert: only the own rows are copied locally
  const double place = 1e3 * 470e6 / 47.7e9 / 8, g0 = ms(p.gemm0_flops, 14) / 8;
  EXPECT_NEAR(comet_cost(p, h100_like()).layer0_ms, place + 8 * g0, 1e-9);
  p.dispatch_ctas = 1;  // the sends start after the own rows, and still land before GEMM0 wants them
  EXPECT_NEAR(comet_cost(p, h100_like()).layer0_ms, place + 8 * g0, 1e-9);
}

TEST(CometCost, NothingToHideMeansTheSmsItTakesAreALoss) {
  CometCostProblem p = deepseek_like();
  p.dispatch_bytes = p.combine_bytes = p.local_bytes_per_source = 0;
  const CometCost c = comet_cost(p, h100_like());
  EXPECT_NEAR(c.comet_ms, c.sequential_ms * 16 / 14, 1e-9);
}

TEST(CometCost, MoreSplitsShortenTheLastSplitsTail) {
  CometCostProblem p = deepseek_like();
  const double four = comet_cost(p, h100_like()).comet_ms;
  p.splits = 14;
  EXPECT_LT(comet_cost(p, h100_like()).comet_ms, four);
}

TEST(CometCost, MoreSendCtasOnlyWhileTheyAreUnderTheLink) {
  CometCostProblem p = deepseek_like();
  const double one = comet_cost(p, h100_like()).layer1_ms;
  p.send_ctas = 3;
  EXPECT_NEAR(comet_cost(p, h100_like()).layer1_ms, one, 1e-9);  // one CTA already outruns the link
  p.link_bytes_per_s = 0;                                        // no link limit: three copy three times as fast
  const double three = comet_cost(p, h100_like()).layer1_ms;
  p.send_ctas = 1;
  EXPECT_LT(three, comet_cost(p, h100_like()).layer1_ms);
}

TEST(CometCost, RefusesWhatMakesNoSense) {
  CometCostProblem p = deepseek_like();
  GpuRates r = h100_like();
  r.copy_bytes_per_cta = 0;
  EXPECT_THROW(comet_cost(p, r), Error);
  p.gemm0_sms = 17;
  EXPECT_THROW(comet_cost(p, h100_like()), Error);
  p = deepseek_like();
  p.world = 1;
  EXPECT_THROW(comet_cost(p, h100_like()), Error);
  p = deepseek_like();
  p.splits = 0;
  EXPECT_THROW(comet_cost(p, h100_like()), Error);
  p = deepseek_like();
  p.dispatch_ctas = 0;
  EXPECT_THROW(comet_cost(p, h100_like()), Error);
}

namespace {

cuda::CometGpuShape deepseek_shape() {  // the problem above as the layer describes it
  cuda::CometGpuShape s;
  s.tokens = 4096;
  s.hidden = 7168;
  s.ffn_hidden = 2048;
  s.experts = 256;
  s.top_k = 8;
  s.world = 8;
  s.sm_count = 16;
  s.sequential_ctas_per_peer = 4;
  s.link_bytes_per_s = 44.8e9;
  return s;
}

std::string refusal_of(const cuda::CometGpuShape& s, const CometOptions& o) {
  return tilemoe::testing::refusal([&] { cuda::comet_gpu_schedule(s, o); });
}

}  // namespace

TEST(CometSchedule, TheModelSizesTheExchangeBesideEachGemm) {
  const GpuRates rates = h100_like();
  const auto provider = [&]() -> const GpuRates& { return rates; };
  const cuda::CometGpuSchedule s = cuda::comet_gpu_schedule(deepseek_shape(), CometOptions{}, provider);
  // a sender and a placer: one CTA would place nothing until every send is out; a third costs GEMM0 a cluster
  EXPECT_EQ(s.dispatch_ctas, 2);
  EXPECT_EQ(s.gemm0_sm_limit, 14);
  // one CTA outruns the link, and a second would leave GEMM1 no more SMs
  EXPECT_EQ(s.send_ctas, 1);
  EXPECT_EQ(s.gemm1_sm_limit, 14);
  EXPECT_EQ(s.split_cols, 2048);
  EXPECT_GT(s.predicted_ms, 0.0);
  EXPECT_LT(s.predicted_ms, s.sequential_ms);
  EXPECT_NE(s.note.find("model"), std::string::npos);

  cuda::CometGpuShape unlimited = deepseek_shape();
  unlimited.link_bytes_per_s = 0;  // NVLink's rate: the sends want every CTA the model weighs
  unlimited.sm_count = 132;
  EXPECT_EQ(cuda::comet_gpu_schedule(unlimited, CometOptions{}, provider).send_ctas, 4);
}

TEST(CometSchedule, TheOptionsCtasAreObeyedOrRefused) {
  CometOptions o;
  o.dispatch_ctas = 3;
  o.send_ctas = 1;
  const cuda::CometGpuSchedule s = cuda::comet_gpu_schedule(deepseek_shape(), o);
  EXPECT_EQ(s.dispatch_ctas, 3);
  EXPECT_EQ(s.gemm0_sm_limit, 12);  // whole 2-SM clusters
  EXPECT_EQ(s.send_ctas, 1);
  EXPECT_EQ(s.gemm1_sm_limit, 14);
  EXPECT_EQ(s.predicted_ms, 0.0);  // no rates, no model
  cuda::CometGpuShape rows = deepseek_shape();
  rows.once_per_rank = false;
  const GpuRates rates = h100_like();
  const auto provider = [&]() -> const GpuRates& { return rates; };
  EXPECT_EQ(cuda::comet_gpu_schedule(rows, CometOptions{}, provider).dispatch_ctas, 1);  // nothing to place: one CTA
  cuda::CometGpuShape shared = deepseek_shape();
  shared.sm_count = 132;
  shared.sharing = 4;  // four ranks on the whole GPU: each GEMM gets a quarter of what the exchanges leave
  o.dispatch_ctas = 2;
  EXPECT_EQ(cuda::comet_gpu_schedule(shared, o).gemm0_sm_limit, 30);
  cuda::CometGpuShape two = deepseek_shape();
  two.world = 2;
  EXPECT_EQ(cuda::comet_gpu_schedule(two, CometOptions{}).send_ctas, 1);  // one peer: one CTA sends

  o.dispatch_ctas = -1;
  EXPECT_NE(refusal_of(deepseek_shape(), o).find("dispatch_ctas must be 0"), std::string::npos);
  o.dispatch_ctas = 0;
  o.send_ctas = 15;
  EXPECT_NE(refusal_of(deepseek_shape(), o).find("send_ctas = 15"), std::string::npos);
  cuda::CometGpuShape tiny = deepseek_shape();
  tiny.sm_count = 2;
  EXPECT_NE(refusal_of(tiny, CometOptions{}).find("use another strategy"), std::string::npos);
}
