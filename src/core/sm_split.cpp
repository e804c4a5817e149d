#include "tilemoe/sm_split.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "tilemoe/error.hpp"

namespace tilemoe {

namespace {

double consumer_seconds(const SplitProblem& p, const GpuRates& r, int ctas) {
  double rate = ctas * r.copy_bytes_per_cta;
  if (p.link_bytes_per_s > 0.0) rate = std::min(rate, p.link_bytes_per_s);
  return p.remote_bytes / rate;
}

// GEMM1 on `sms` SMs: its persistent 2-CTA clusters take the tiles in rounds, so a split that
// leaves the tiles one round more costs a whole round (measured: 512 Mixtral tiles on 15
// clusters of a 32-SM partition take 35 rounds where 16 clusters take 32, +9%).
double gemm_seconds(const SplitProblem& p, const GpuRates& r, int sms) {
  const double even = p.gemm1_flops / (r.gemm_flops_per_sm * sms);
  if (p.column_tiles <= 0) return even;
  const double items = static_cast<double>(p.bands) * p.column_tiles / 2.0;
  const int clusters = std::max(1, sms / 2);
  const double rounds = std::ceil(items / clusters);
  return even * rounds / (items / clusters);
}

}  // namespace

SplitChoice choose_split(const SplitProblem& problem, const GpuRates& rates, int min_ctas, int max_ctas, double margin,
                         int ctas_step) {
  if (rates.gemm_flops_per_sm <= 0.0 || rates.copy_bytes_per_cta <= 0.0) {
    throw_bad_input("SM split: the calibrated rates must be positive");
  }
  if (problem.sms < 3 || problem.gemm1_flops < 0.0 || problem.remote_bytes < 0.0 || problem.bands < 1) {
    throw_bad_input("SM split: a problem needs >= 3 SMs, non-negative work and at least one band");
  }
  if (min_ctas < 1 || max_ctas < min_ctas || ctas_step < 1) throw_bad_input("SM split: bad range of consumer CTAs");
  SplitChoice best;
  const double gemm_all = gemm_seconds(problem, rates, problem.sms);
  best.sequential_ms = 1e3 * (gemm_all + consumer_seconds(problem, rates, problem.sms));
  best.predicted_ms = best.sequential_ms;
  const int top = std::min(max_ctas, problem.sms - 2);
  double least = 0.0;
  for (int c = min_ctas; c <= top; c += ctas_step) {
    const double gemm = gemm_seconds(problem, rates, problem.sms - c);
    const double comm = consumer_seconds(problem, rates, c);
    const double ms = 1e3 * (std::max(gemm, comm) + comm / problem.bands);
    if (best.best_ctas == 0 || ms < least) {
      best.best_ctas = c;
      least = ms;
    }
    if (ms < best.predicted_ms * (best.overlap ? 1.0 : 1.0 - margin)) {
      best.overlap = true;
      best.consumer_ctas = c;
      best.predicted_ms = ms;
    }
  }
  return best;
}

std::string default_rates_path() {
  std::filesystem::path dir;
  if (const char* own = std::getenv("TILEMOE_CACHE_DIR"); own && *own) {
    dir = own;
  } else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    dir = std::filesystem::path(xdg) / "tilemoe";
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    dir = std::filesystem::path(home) / ".cache" / "tilemoe";
  } else {
    dir = std::filesystem::temp_directory_path() / "tilemoe";
  }
  return (dir / "gpu_rates.json").string();
}

std::optional<GpuRates> load_rates(const std::string& path, const std::string& gpu) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    const auto doc = nlohmann::json::parse(in);
    const auto entry = doc.at("gpus").at(gpu);
    GpuRates r;
    r.gpu = gpu;
    r.sms = entry.at("sms").get<int>();
    r.gemm_flops_per_sm = entry.at("gemm_flops_per_sm").get<double>();
    r.copy_bytes_per_cta = entry.at("copy_bytes_per_cta").get<double>();
    if (r.sms <= 0 || r.gemm_flops_per_sm <= 0.0 || r.copy_bytes_per_cta <= 0.0) return std::nullopt;
    return r;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // malformed or without this GPU: calibrate again
  }
}

void save_rates(const std::string& path, const GpuRates& rates) {
  nlohmann::json doc = {{"gpus", nlohmann::json::object()}};
  {
    std::ifstream in(path);
    if (in) {
      try {
        auto old = nlohmann::json::parse(in);
        if (old.contains("gpus") && old["gpus"].is_object()) doc = old;
      } catch (const nlohmann::json::exception&) {
        // a broken cache is replaced
      }
    }
  }
  doc["gpus"][rates.gpu] = {{"sms", rates.sms}, {"gemm_flops_per_sm", rates.gemm_flops_per_sm},
                            {"copy_bytes_per_cta", rates.copy_bytes_per_cta}};
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), error);
  // a temporary of this process and thread: the processes of a world calibrate and save at
  // once, and a shared temporary would be truncated under another writer or renamed away
  const std::string temporary = path + ".tmp." + std::to_string(getpid()) + "." +
                                std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  {
    std::ofstream out(temporary, std::ios::trunc);
    if (!out) throw_bad_input("cannot write the GPU rates cache '" + path + "' (set TILEMOE_CACHE_DIR to a writable folder)");
    out << doc.dump(2) << "\n";
    if (!out.flush()) {
      std::remove(temporary.c_str());
      throw_bad_input("writing the GPU rates cache '" + path + "' failed");
    }
  }
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::remove(temporary.c_str());
    throw_bad_input("cannot write the GPU rates cache '" + path + "': " + error.message());
  }
}

}  // namespace tilemoe
