// The benchmarks' phase watchdog: a phase that runs past its limit ends the process with exit
// code 3 and a message naming the phase; phases within the limit never fire it.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "phase_watchdog.hpp"

using namespace std::chrono_literals;

TEST(PhaseWatchdog, StallNamesThePhaseAndExits) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        bench::PhaseWatchdog watchdog("bench", 0.5, [] { return std::string("SM clock 1980 MHz"); });
        watchdog.enter("case A: quick phase");
        std::this_thread::sleep_for(100ms);
        watchdog.enter("case A: the stuck phase");
        std::this_thread::sleep_for(10s);
      },
      ::testing::ExitedWithCode(3), "bench: stalled: 'case A: the stuck phase' has run for [0-9.]+ s.*\n.*SM clock 1980 MHz");
}

TEST(PhaseWatchdog, AStalledStateQueryStillExits) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        bench::PhaseWatchdog watchdog("bench", 0.5, [] {
          std::this_thread::sleep_for(60s);
          return std::string();
        });
        watchdog.enter("waiting");
        std::this_thread::sleep_for(30s);
      },
      ::testing::ExitedWithCode(3), "did not answer within 5 s");
}

TEST(PhaseWatchdog, PhasesWithinTheLimitDoNotFire) {
  bench::PhaseWatchdog watchdog("bench", 0.6, [] { return std::string(); });
  for (int i = 0; i < 6; ++i) {
    watchdog.enter("phase " + std::to_string(i));
    std::this_thread::sleep_for(200ms);  // 1.2 s in all, each phase well inside 0.6 s
  }
  SUCCEED();
}
