#include "progress.hpp"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>

namespace tilemoe::cli {

ProgressBar::ProgressBar(std::string label, std::uint64_t total, const std::atomic<std::uint64_t>& done) {
  if (total > 0) start(std::move(label), total, &done);
}

ProgressBar::ProgressBar(std::string label) { start(std::move(label), 0, nullptr); }

void ProgressBar::start(std::string label, std::uint64_t total, const std::atomic<std::uint64_t>* done) {
  const bool terminal = isatty(STDERR_FILENO) != 0;
  thread_ = std::jthread([label = std::move(label), total, done, terminal](std::stop_token stop) {
    const auto start = std::chrono::steady_clock::now();
    bool shown = false;
    // Waits on the stop token, not a plain sleep: the work's end wakes the bar at once, so a
    // short run does not pay up to a tick at every bar's destruction.
    std::mutex mutex;
    std::condition_variable_any tick;
    std::unique_lock lock(mutex);
    while (!stop.stop_requested()) {
      tick.wait_for(lock, stop, std::chrono::milliseconds(100), [] { return false; });
      if (stop.stop_requested()) break;
      const std::chrono::duration<double> spent = std::chrono::steady_clock::now() - start;
      if (spent < std::chrono::seconds(1)) continue;
      if (!terminal) {
        if (spent < std::chrono::seconds(5)) continue;  // a log gets a line only for work worth waiting on
        if (!shown) std::fprintf(stderr, "tilemoe: %s...\n", label.c_str());
        shown = true;
        continue;
      }
      if (done != nullptr) {
        const double share = static_cast<double>(done->load(std::memory_order_relaxed)) / static_cast<double>(total);
        const int filled = static_cast<int>(share * 30.0);
        std::fprintf(stderr, "\r%-16s [%.*s%*s] %3d%%", label.c_str(), filled, "##############################", 30 - filled, "",
                     static_cast<int>(share * 100.0));
      } else {
        std::fprintf(stderr, "\r%-16s %6.0f s", label.c_str(), spent.count());
      }
      std::fflush(stderr);
      shown = true;
    }
    if (shown && terminal) std::fprintf(stderr, "\r%60s\r", "");
  });
}

ProgressBar::~ProgressBar() = default;  // jthread requests stop and joins

}  // namespace tilemoe::cli
