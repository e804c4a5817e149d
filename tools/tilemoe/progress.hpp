#pragma once
// A progress bar on stderr for runs that take over a second; silent when stderr is not a
// terminal, so logs and tests stay clean.
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

namespace tilemoe::cli {

class ProgressBar {
 public:
  ProgressBar(std::string label, std::uint64_t total, const std::atomic<std::uint64_t>& done);
  ~ProgressBar();  // stops and clears the bar
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

 private:
  std::jthread thread_;
};

}  // namespace tilemoe::cli
