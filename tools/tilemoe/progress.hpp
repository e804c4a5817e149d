#pragma once
// Progress on stderr for work that takes over a second, so that a long run is never silent:
// on a terminal a live bar (or, without a count, the seconds spent) once the work has taken a
// second, elsewhere (logs, pipes) one line naming the work once it has taken five. Nothing for
// shorter work, so small runs and tests stay quiet.
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

namespace tilemoe::cli {

class ProgressBar {
 public:
  // `done` of `total` units, read while the work runs
  ProgressBar(std::string label, std::uint64_t total, const std::atomic<std::uint64_t>& done);
  // work without a count: its label and the seconds it has taken
  explicit ProgressBar(std::string label);
  ~ProgressBar();  // stops and clears the bar
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

 private:
  void start(std::string label, std::uint64_t total, const std::atomic<std::uint64_t>* done);
  std::jthread thread_;
};

}  // namespace tilemoe::cli
