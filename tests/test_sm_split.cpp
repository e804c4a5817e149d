// The tile-signal SM split: the cost model's choices and the rates cache.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tilemoe/error.hpp"
#include "strategies/tile_signal/split_model.hpp"

using namespace tilemoe;

namespace {

GpuRates h200_like() {
  GpuRates r;
  r.gpu = "test GPU, 132 SMs";
  r.sms = 132;
  r.gemm_flops_per_sm = 5.5e12;  // ~730 TFLOP/s over 132 SMs
  r.copy_bytes_per_cta = 20e9;
  return r;
}

SplitProblem problem(double gemm_tflop, double remote_gb, double link_gbps, int bands = 256) {
  SplitProblem p;
  p.gemm1_flops = gemm_tflop * 1e12;
  p.remote_bytes = remote_gb * 1e9;
  p.link_bytes_per_s = link_gbps * 1e9;
  p.bands = bands;
  p.sms = 132;
  return p;
}

}  // namespace

TEST(SmSplit, BalancedWorkOverlapsAndBeatsSequential) {
  // 2 TFLOP of GEMM1 (~2.8 ms) and 1 GB to ship over a 370 GB/s link (~2.7 ms)
  const SplitChoice c = choose_split(problem(2.0, 1.0, 370.0), h200_like());
  EXPECT_TRUE(c.overlap);
  EXPECT_GE(c.consumer_ctas, 2);
  EXPECT_LE(c.consumer_ctas, 32);
  EXPECT_LT(c.predicted_ms, c.sequential_ms * 0.97);
  // enough CTAs to fill the link (19 at 20 GB/s each), no more than that needs
  EXPECT_GE(c.consumer_ctas, 16);
}

TEST(SmSplit, NoCommunicationMeansSequential) {
  const SplitChoice c = choose_split(problem(2.0, 0.0, 370.0), h200_like());
  EXPECT_FALSE(c.overlap);
  EXPECT_EQ(c.predicted_ms, c.sequential_ms);
  EXPECT_EQ(c.best_ctas, 2);  // the least split still has a value, for an explicit tile_signal
}

TEST(SmSplit, MoreBytesPerFlopTakesMoreConsumerCtasUpToTheLink) {
  const int few = choose_split(problem(4.0, 0.2, 370.0), h200_like()).consumer_ctas;
  const int many = choose_split(problem(4.0, 2.0, 370.0), h200_like()).consumer_ctas;
  EXPECT_GE(few, 2);
  EXPECT_LT(few, many);
  // on one GPU with no link limit the sequential combine on all SMs is as fast: no split
  EXPECT_FALSE(choose_split(problem(4.0, 2.0, 0.0), h200_like()).overlap);
  // with the link the limit, more CTAs than fill it buy nothing
  const SplitChoice linked = choose_split(problem(4.0, 2.0, 100.0), h200_like());
  EXPECT_LE(linked.consumer_ctas, 6);
}

TEST(SmSplit, NeverPredictsWorseThanSequential) {
  for (double tflop : {0.01, 0.1, 1.0, 10.0}) {
    for (double gb : {0.001, 0.05, 0.5, 5.0}) {
      for (double link : {0.0, 50.0, 370.0}) {
        const SplitChoice c = choose_split(problem(tflop, gb, link), h200_like());
        EXPECT_LE(c.predicted_ms, c.sequential_ms) << tflop << " TFLOP, " << gb << " GB, link " << link;
        if (c.overlap) {
          EXPECT_LT(c.predicted_ms, c.sequential_ms * 0.97);
        }
      }
    }
  }
}

TEST(SmSplit, StepsThroughEvenSplitsOnly) {
  for (double gb : {0.05, 0.5, 1.0, 2.0}) {
    const SplitChoice c = choose_split(problem(2.0, gb, 370.0), h200_like(), 2, 32, 0.03, 2);
    EXPECT_EQ(c.best_ctas % 2, 0) << gb << " GB";
    if (c.overlap) {
      EXPECT_EQ(c.consumer_ctas % 2, 0) << gb << " GB";
    }
  }
  EXPECT_THROW(choose_split(problem(2.0, 1.0, 370.0), h200_like(), 2, 32, 0.03, 0), Error);
}

TEST(SmSplit, CountsWholeRoundsOfGemmClusters) {
  // 32 SMs, 512 items (64 bands x 16 column tiles): 16 clusters take 32 rounds, 15 take 35
  SplitProblem p = problem(1.0, 0.0, 0.0);
  p.sms = 32;
  p.bands = 64;
  const SplitChoice smooth = choose_split(p, h200_like(), 2, 8, 0.03, 2);
  p.column_tiles = 16;
  const SplitChoice rounded = choose_split(p, h200_like(), 2, 8, 0.03, 2);
  EXPECT_DOUBLE_EQ(smooth.sequential_ms, rounded.sequential_ms);  // 32 rounds exactly
  // a little communication that the smooth model would hide profitably loses to the extra round
  p.remote_bytes = 0.058e9;
  p.link_bytes_per_s = 90e9;
  EXPECT_FALSE(choose_split(p, h200_like(), 2, 8, 0.03, 2).overlap);
  p.column_tiles = 0;
  EXPECT_TRUE(choose_split(p, h200_like(), 2, 8, 0.03, 2).overlap);
}

TEST(SmSplit, RejectsNonsense) {
  GpuRates bad = h200_like();
  bad.copy_bytes_per_cta = 0;
  EXPECT_THROW(choose_split(problem(1, 1, 0), bad), Error);
  SplitProblem tiny = problem(1, 1, 0);
  tiny.sms = 2;
  EXPECT_THROW(choose_split(tiny, h200_like()), Error);
}

TEST(SmSplit, RatesCacheRoundTripsAndIgnoresBrokenFiles) {
  const auto dir = std::filesystem::temp_directory_path() / "tilemoe_sm_split_test";
  std::filesystem::remove_all(dir);
  const std::string path = (dir / "gpu_rates.json").string();
  EXPECT_FALSE(load_rates(path, "test GPU, 132 SMs").has_value());  // no file yet
  save_rates(path, h200_like());
  GpuRates other = h200_like();
  other.gpu = "another GPU";
  other.sms = 80;
  save_rates(path, other);  // a second GPU keeps the first
  const auto back = load_rates(path, "test GPU, 132 SMs");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->sms, 132);
  EXPECT_EQ(back->gemm_flops_per_sm, 5.5e12);
  EXPECT_EQ(load_rates(path, "another GPU")->sms, 80);
  EXPECT_FALSE(load_rates(path, "a third GPU").has_value());
  { std::ofstream(path) << "{ not json"; }
  EXPECT_FALSE(load_rates(path, "test GPU, 132 SMs").has_value());
  save_rates(path, h200_like());  // a broken cache is replaced
  EXPECT_TRUE(load_rates(path, "test GPU, 132 SMs").has_value());
  std::filesystem::remove_all(dir);
}

// The processes of a world (and threads of virtual ranks) calibrate and save at once: every
// save succeeds, the file is whole after each, and nothing is left behind.
TEST(SmSplit, ConcurrentSavesLeaveAWholeCache) {
  const auto dir = std::filesystem::temp_directory_path() / "tilemoe_sm_split_concurrent";
  std::filesystem::remove_all(dir);
  const std::string path = (dir / "gpu_rates.json").string();
  constexpr int kWriters = 8, kSaves = 40;
  std::vector<std::string> errors(kWriters);
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      GpuRates mine = h200_like();
      mine.gpu = "GPU " + std::to_string(w);
      try {
        for (int i = 0; i < kSaves; ++i) save_rates(path, mine);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(w)] = e.what();
      }
    });
  }
  for (auto& t : writers) t.join();
  for (int w = 0; w < kWriters; ++w) EXPECT_EQ(errors[static_cast<std::size_t>(w)], "") << "writer " << w;
  int found = 0;
  for (int w = 0; w < kWriters; ++w) found += load_rates(path, "GPU " + std::to_string(w)).has_value() ? 1 : 0;
  EXPECT_GE(found, 1);  // a whole file (writers racing on read-modify-write may drop each other's entry)
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files += entry.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1) << "temporaries left behind";
  std::filesystem::remove_all(dir);
}

TEST(SmSplit, DefaultPathFollowsTheEnvironment) {
  setenv("TILEMOE_CACHE_DIR", "/some/where", 1);
  EXPECT_EQ(default_rates_path(), "/some/where/gpu_rates.json");
  unsetenv("TILEMOE_CACHE_DIR");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(default_rates_path(), "/xdg/tilemoe/gpu_rates.json");
  unsetenv("XDG_CACHE_HOME");
}
