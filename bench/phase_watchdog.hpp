#pragma once
// Bounds the time between a benchmark's named phases. The bench names what it is about to do (enter("case:
// phase")); a thread checks that no phase runs longer than the limit. When one does, it prints
// the phase and how long it has run, then the GPU's clock, power and clocks-event reasons (a
// throttled card and a stalled kernel read differently), and ends the process with exit code 3.
// Why: a sweep once sat for minutes inside one case with nothing printed, until the call's time
// limit cut it; a stalled kernel or driver call must become an error that names what waited.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace bench {

class PhaseWatchdog {
 public:
  // state(): one line on the GPU's state, printed when the watchdog fires (it may itself stall:
  // it gets 5 s, then the process ends without it).
  PhaseWatchdog(const char* program, double limit_s, std::function<std::string()> state)
      : program_(program), limit_(limit_s), state_(std::move(state)), entered_(Clock::now()) {
    thread_ = std::thread([this] { watch(); });
  }
  ~PhaseWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  PhaseWatchdog(const PhaseWatchdog&) = delete;
  PhaseWatchdog& operator=(const PhaseWatchdog&) = delete;

  void enter(std::string phase) {
    std::lock_guard<std::mutex> lock(mutex_);
    phase_ = std::move(phase);
    entered_ = Clock::now();
  }

 private:
  using Clock = std::chrono::steady_clock;

  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!done_) {
      wake_.wait_for(lock, std::chrono::milliseconds(500));
      if (done_) return;
      const double ran = std::chrono::duration<double>(Clock::now() - entered_).count();
      if (ran < limit_) continue;
      std::fprintf(stderr, "%s: stalled: '%s' has run for %.1f s (limit %.1f s)\n", program_, phase_.c_str(), ran, limit_);
      std::fflush(stderr);
      lock.unlock();
      auto report = std::make_shared<std::string>();
      auto ready = std::make_shared<std::atomic<bool>>(false);
      std::thread([report, ready, state = state_] {
        *report = state ? state() : std::string();
        ready->store(true);
      }).detach();
      for (int i = 0; i < 50 && !ready->load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (ready->load()) {
        std::fprintf(stderr, "%s: GPU at the stall: %s\n", program_, report->c_str());
      } else {
        std::fprintf(stderr, "%s: the GPU state query itself did not answer within 5 s\n", program_);
      }
      std::fflush(stderr);
      std::fflush(stdout);
      std::_Exit(3);
    }
  }

  const char* program_;
  const double limit_;
  const std::function<std::string()> state_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::string phase_ = "start-up";
  Clock::time_point entered_;
  std::thread thread_;
};

}  // namespace bench
