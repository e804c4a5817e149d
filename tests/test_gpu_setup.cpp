// The GPU layer's setup decisions, taken by the strategies (src/strategies/*/): tile_signal's
// split of the SMs and GEMM1's band blocks, and the exchange kernels' CTAs. Plain C++: the layer
// only asks and obeys, so the rules are checked here without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "strategies/sequential/exchange_setup.hpp"
#include "strategies/tile_signal/defaults.hpp"
#include "strategies/tile_signal/gpu_setup.hpp"
#include "refusal.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;
using namespace tilemoe::cuda;
using tilemoe::testing::refusal;

namespace {

GpuRates h100_like() {
  GpuRates r;
  r.gpu = "test GPU, 132 SMs";
  r.sms = 132;
  r.gemm_flops_per_sm = 5.0e12;
  r.copy_bytes_per_cta = 20e9;
  return r;
}

// DeepSeek-V3-like: 4096 tokens x top-8 per rank, hidden 7168, ffn 2048, 8 ranks on their own GPUs
TileSignalGpuShape deepseek_like(int world = 8) {
  TileSignalGpuShape s;
  s.tokens = 4096;
  s.top_k = 8;
  s.hidden = 7168;
  s.ffn_hidden = 2048;
  s.world = world;
  s.sm_count = 132;
  s.sharing = 1;
  s.resident_exchange_ctas = 2 * 132;
  s.link_bytes_per_s = 370e9;
  return s;
}

}  // namespace

TEST(TileSignalGpuSetup, GivenConsumerCtasNeedNoModel) {
  TileSignalOptions options;
  options.consumer_ctas = 8;
  int asked = 0;
  const GpuRates rates = h100_like();
  const TileSignalSplit split = choose_tile_signal_split(deepseek_like(), options, false, [&]() -> const GpuRates& {
    ++asked;
    return rates;
  });
  EXPECT_EQ(asked, 0);  // the GPU is not calibrated for a split the user gave
  EXPECT_TRUE(split.overlap);
  EXPECT_EQ(split.consumer_ctas, 8);
  EXPECT_FALSE(split.chosen_by_model);
}

TEST(TileSignalGpuSetup, AutoWithoutPeersRunsSequential) {
  const GpuRates rates = h100_like();
  const TileSignalSplit split = choose_tile_signal_split(deepseek_like(1), {}, true, [&]() -> const GpuRates& { return rates; });
  EXPECT_FALSE(split.overlap);  // nothing to hide: one rank sends no rows to others
  EXPECT_TRUE(split.chosen_by_model);
  EXPECT_EQ(split.consumer_ctas % 2, 0);
  EXPECT_NE(split.note.find("auto: "), std::string::npos);
}

TEST(TileSignalGpuSetup, ModelPicksAnEvenSplitForTileSignal) {
  const GpuRates rates = h100_like();
  const TileSignalSplit split = choose_tile_signal_split(deepseek_like(), {}, false, [&]() -> const GpuRates& { return rates; });
  EXPECT_TRUE(split.overlap);  // tile_signal asked by name overlaps, with the model's best split
  EXPECT_TRUE(split.chosen_by_model);
  EXPECT_GE(split.consumer_ctas, 2);
  EXPECT_LE(split.consumer_ctas, 32);
  EXPECT_EQ(split.consumer_ctas % 2, 0);
}

TEST(TileSignalGpuSetup, ScheduleFollowsTheSplit) {
  const TileSignalGpuShape shape = deepseek_like();
  const TileSignalGpuSchedule s = tile_signal_gpu_schedule(shape, {}, 16);
  EXPECT_EQ(s.consumer_ctas, 16);
  EXPECT_EQ(s.gemm1_sm_limit, 132 - 16);
  EXPECT_EQ(s.bands_per_segment, 1);  // the GPU's default
  EXPECT_EQ(s.band_block, default_band_block(132 - 16, (7168 + 255) / 256));
  EXPECT_EQ(s.band_block % 2, 0);
  TileSignalOptions given;
  given.band_block = 6;
  given.bands_per_segment = 2;
  const TileSignalGpuSchedule g = tile_signal_gpu_schedule(shape, given, 16);
  EXPECT_EQ(g.band_block, 6);
  EXPECT_EQ(g.bands_per_segment, 2);
}

TEST(TileSignalGpuSetup, RefusesSplitsThatCannotRun) {
  const TileSignalGpuShape shape = deepseek_like();
  EXPECT_NE(refusal([&] { tile_signal_gpu_schedule(shape, {}, 7); }).find("even"), std::string::npos);
  EXPECT_NE(refusal([&] { tile_signal_gpu_schedule(shape, {}, 132); }).find("less than one 2-SM cluster"), std::string::npos);
  TileSignalOptions odd_block;
  odd_block.band_block = 3;
  EXPECT_NE(refusal([&] { tile_signal_gpu_schedule(shape, odd_block, 8); }).find("band_block"), std::string::npos);
  TileSignalOptions long_segments;
  long_segments.bands_per_segment = 33;
  refusal([&] { tile_signal_gpu_schedule(shape, long_segments, 8); });
  // four virtual ranks sharing the SMs: all their consumers together at most half of them
  TileSignalGpuShape shared = shape;
  shared.sharing = 4;
  EXPECT_NE(refusal([&] { tile_signal_gpu_schedule(shared, {}, 18); }).find("more than half"), std::string::npos);
  EXPECT_EQ(tile_signal_gpu_schedule(shared, {}, 16).gemm1_sm_limit, 132 - 64);
}

TEST(TileSignalDefaults, BandsPerSegmentPerBackend) {
  EXPECT_EQ(cpu_bands_per_segment({}), 2);
  EXPECT_EQ(gpu_bands_per_segment({}), 1);
  TileSignalOptions three;
  three.bands_per_segment = 3;
  EXPECT_EQ(cpu_bands_per_segment(three), 3);
  EXPECT_EQ(gpu_bands_per_segment(three), 3);
}

TEST(ExchangeSetup, CtasPerPeerFitTheSharedGpu) {
  ExchangeShape s;
  s.world = 4;
  s.sm_count = 132;
  s.sharing = 4;
  s.resident_ctas_per_sm = 2;  // 264 resident: 16 per peer of each of 4 x 4 ranks
  EXPECT_EQ(choose_exchange_ctas_per_peer(s, 0), 8);  // half of what fits, at most 8
  EXPECT_EQ(choose_exchange_ctas_per_peer(s, 16), 16);
  EXPECT_NE(refusal([&] { choose_exchange_ctas_per_peer(s, 17); }).find("at most 16 each"), std::string::npos);
  refusal([&] { choose_exchange_ctas_per_peer(s, -1); });
  s.resident_ctas_per_sm = 0;
  EXPECT_NE(refusal([&] { choose_exchange_ctas_per_peer(s, 0); }).find("do not fit on one GPU"), std::string::npos);
}
