#include "progress.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace tilemoe::cli {

ProgressBar::ProgressBar(std::string label, std::uint64_t total, const std::atomic<std::uint64_t>& done) {
  if (!isatty(STDERR_FILENO) || total == 0) return;
  thread_ = std::jthread([label = std::move(label), total, &done](std::stop_token stop) {
    const auto start = std::chrono::steady_clock::now();
    bool shown = false;
    while (!stop.stop_requested()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (std::chrono::steady_clock::now() - start < std::chrono::seconds(1)) continue;
      const double share = static_cast<double>(done.load(std::memory_order_relaxed)) / static_cast<double>(total);
      const int filled = static_cast<int>(share * 30.0);
      std::fprintf(stderr, "\r%-12s [%.*s%*s] %3d%%", label.c_str(), filled, "##############################", 30 - filled, "",
                   static_cast<int>(share * 100.0));
      std::fflush(stderr);
      shown = true;
    }
    if (shown) std::fprintf(stderr, "\r%60s\r", "");
  });
}

ProgressBar::~ProgressBar() = default;  // jthread requests stop and joins

}  // namespace tilemoe::cli
