// The GPU executors' traces, checked on the CPU: the hidden share and the trace file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tilemoe/error.hpp"
#include "tilemoe/trace.hpp"

using namespace tilemoe;
using ::testing::DoubleNear;

namespace {

DeviceSpan span(int rank, const char* track, std::uint64_t start, std::uint64_t end, bool remote = false) {
  DeviceSpan s;
  s.rank = rank;
  s.track = track;
  s.label = std::string(track) + " " + std::to_string(start);
  s.start_ns = start;
  s.end_ns = end;
  s.remote = remote;
  return s;
}

}  // namespace

TEST(DeviceTrace, HiddenShareCountsRemoteTimeUnderComputeOfTheSameRank) {
  const std::vector<DeviceSpan> spans = {
      span(0, "gemm", 100, 200), span(0, "gemm", 200, 300),  // rank 0 computes 100..300
      span(0, "consumer", 150, 250, true),                     // fully hidden: 100
      span(0, "consumer", 280, 380, true),                     // 20 of 100 hidden
      span(0, "consumer", 120, 180, false),                    // local: not counted
      span(1, "gemm", 0, 50), span(1, "consumer", 1000, 1100, true),  // rank 1: nothing hidden (other rank's gemm does not count)
  };
  EXPECT_THAT(hidden_share(spans, "gemm", "consumer"), DoubleNear(120.0 / 300.0, 1e-12));
  EXPECT_EQ(hidden_share({span(0, "gemm", 0, 10)}, "gemm", "consumer"), 0.0);
}

TEST(DeviceTrace, WritesAProcessPerRankAndAThreadPerTrack) {
  const auto path = (std::filesystem::temp_directory_path() / "tilemoe_device_trace_test.json").string();
  std::vector<DeviceSpan> spans = {span(0, "GEMM1 tiles", 5000, 6000), span(0, "consumer", 5500, 7000, true),
                                   span(1, "GEMM1 tiles", 5200, 6100), span(0, "GEMM1 tiles", 5100, 5900)};
  spans.back().lane = 1;  // a second CTA of rank 0's GEMM: its own thread
  write_device_trace(path, "tile_signal", spans);
  std::ifstream in(path);
  const auto doc = nlohmann::json::parse(in);
  int processes = 0, threads = 0, slices = 0;
  double earliest = 1e30;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") ++processes;
    if (e["ph"] == "M" && e["name"] == "thread_name") ++threads;
    if (e["ph"] == "X") {
      ++slices;
      earliest = std::min(earliest, e["ts"].get<double>());
    }
  }
  EXPECT_EQ(processes, 2);
  EXPECT_EQ(threads, 4);
  EXPECT_EQ(slices, 4);
  EXPECT_EQ(earliest, 0.0);  // relative to the first span
  std::filesystem::remove(path);
}

TEST(DeviceTrace, AnUnwritablePathIsBadInputAndLeavesNothing) {
  try {
    write_device_trace("/nonexistent-dir/trace.json", "x", {span(0, "t", 0, 1)});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput);
  }
  EXPECT_FALSE(std::filesystem::exists("/nonexistent-dir/trace.json.tmp"));
}
