#include "tilemoe/gpu_rates.hpp"

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
