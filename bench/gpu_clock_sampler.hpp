#pragma once
// Samples the GPU's SM clock and board power while a benchmark region runs, through NVML
// (loaded at run time: the driver ships libnvidia-ml, the toolkit here has no header for it).
// Why: the matrix rate of the roofline floor is measured on a short cuBLAS 8192^3 product; a
// long grouped GEMM can run at a lower clock once the board reaches its power limit, and the
// ratio of the two clocks is then part of the gap to the floor. A machine without NVML gives
// no samples (available() is false), never an error.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

namespace bench {

class GpuClockSampler {
 public:
  struct Summary {
    int samples = 0;
    double mean_sm_mhz = 0, min_sm_mhz = 0, mean_watts = 0, max_watts = 0;
    unsigned long long throttle_reasons = 0;  // NVML clocks-event reasons seen (OR of all samples)
  };

  explicit GpuClockSampler(int cuda_device) {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) return;
    auto init = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlInit_v2"));
    auto by_bus = reinterpret_cast<int (*)(const char*, void**)>(dlsym(lib_, "nvmlDeviceGetHandleByPciBusId_v2"));
    clock_ = reinterpret_cast<int (*)(void*, int, unsigned*)>(dlsym(lib_, "nvmlDeviceGetClockInfo"));
    power_ = reinterpret_cast<int (*)(void*, unsigned*)>(dlsym(lib_, "nvmlDeviceGetPowerUsage"));
    reasons_ = reinterpret_cast<int (*)(void*, unsigned long long*)>(dlsym(lib_, "nvmlDeviceGetCurrentClocksEventReasons"));
    if (reasons_ == nullptr) {
      reasons_ = reinterpret_cast<int (*)(void*, unsigned long long*)>(dlsym(lib_, "nvmlDeviceGetCurrentClocksThrottleReasons"));
    }
    char bus[32] = {};
    if (init == nullptr || by_bus == nullptr || clock_ == nullptr || power_ == nullptr || init() != 0 ||
        cudaDeviceGetPCIBusId(bus, sizeof bus, cuda_device) != cudaSuccess || by_bus(bus, &device_) != 0) {
      device_ = nullptr;
    }
  }
  ~GpuClockSampler() {
    stop();
    if (lib_ != nullptr) {
      if (auto shutdown = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlShutdown"))) shutdown();
      dlclose(lib_);
    }
  }
  GpuClockSampler(const GpuClockSampler&) = delete;
  GpuClockSampler& operator=(const GpuClockSampler&) = delete;

  bool available() const { return device_ != nullptr; }

  // Samples every 20 ms from start() until stop(), which returns what was seen.
  void start() {
    stop();
    if (!available()) return;
    sm_mhz_.clear();
    watts_.clear();
    reasons_seen_ = 0;
    running_ = true;
    thread_ = std::thread([this] {
      while (running_) {
        unsigned mhz = 0, mw = 0;
        unsigned long long why = 0;
        if (clock_(device_, /*NVML_CLOCK_SM*/ 1, &mhz) == 0 && power_(device_, &mw) == 0) {
          sm_mhz_.push_back(mhz);
          watts_.push_back(mw * 1e-3);
        }
        if (reasons_ != nullptr && reasons_(device_, &why) == 0) reasons_seen_ |= why;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }

  Summary stop() {
    if (thread_.joinable()) {
      running_ = false;
      thread_.join();
    }
    Summary s;
    s.samples = int(sm_mhz_.size());
    if (s.samples == 0) return s;
    s.min_sm_mhz = sm_mhz_[0];
    for (std::size_t i = 0; i < sm_mhz_.size(); ++i) {
      s.mean_sm_mhz += sm_mhz_[i] / s.samples;
      s.mean_watts += watts_[i] / s.samples;
      s.min_sm_mhz = std::min(s.min_sm_mhz, double(sm_mhz_[i]));
      s.max_watts = std::max(s.max_watts, watts_[i]);
    }
    s.throttle_reasons = reasons_seen_;
    return s;
  }

  // One reading now, as text (for a stall report; works whether or not a sampling is running).
  std::string snapshot() const {
    if (!available()) return "no NVML";
    unsigned mhz = 0, mw = 0;
    unsigned long long why = 0;
    const bool clock_ok = clock_(device_, /*NVML_CLOCK_SM*/ 1, &mhz) == 0;
    const bool power_ok = power_(device_, &mw) == 0;
    const bool reasons_ok = reasons_ != nullptr && reasons_(device_, &why) == 0;
    const std::string clock = clock_ok ? std::to_string(mhz) : "?";
    const std::string power = power_ok ? std::to_string(mw / 1000) : "?";
    char reasons[24] = "?";
    if (reasons_ok) std::snprintf(reasons, sizeof reasons, "0x%llx", why);
    return "SM clock " + clock + " MHz, power " + power + " W, clocks-event reasons " + reasons;
  }

  static std::string json(const Summary& s) {
    char text[200];
    std::snprintf(text, sizeof text,
                  "{\"samples\":%d,\"mean_sm_mhz\":%.0f,\"min_sm_mhz\":%.0f,\"mean_watts\":%.0f,\"max_watts\":%.0f,"
                  "\"reasons\":\"0x%llx\"}",
                  s.samples, s.mean_sm_mhz, s.min_sm_mhz, s.mean_watts, s.max_watts, s.throttle_reasons);
    return text;
  }

 private:
  void* lib_ = nullptr;
  void* device_ = nullptr;
  int (*clock_)(void*, int, unsigned*) = nullptr;
  int (*power_)(void*, unsigned*) = nullptr;
  int (*reasons_)(void*, unsigned long long*) = nullptr;
  std::atomic<bool> running_{false};
  std::thread thread_;
  std::vector<unsigned> sm_mhz_;
  std::vector<double> watts_;
  unsigned long long reasons_seen_ = 0;
};

}  // namespace bench
