#pragma once
// The rates of one GPU that cost models need, measured once per GPU (src/exec/cuda/gpu_rates.cu)
// and kept in a small JSON cache file, so a process does not spend ~50 ms calibrating each time.
#include <optional>
#include <string>

namespace tilemoe {

struct GpuRates {
  std::string gpu;                      // e.g. "NVIDIA H200, 132 SMs": the cache key
  int sms = 0;
  double gemm_flops_per_sm = 0.0;       // bf16 grouped GEMM, FLOP/s per SM
  double copy_bytes_per_cta = 0.0;      // the consumer's row copy, bytes/s per CTA
};

// The calibration cache: a JSON file of rates per GPU. `load_rates` returns nothing for a
// missing, unreadable or malformed file, or one without this GPU (the caller calibrates);
// `save_rates` replaces this GPU's entry, writing through a temporary file.
std::string default_rates_path();  // $TILEMOE_CACHE_DIR, else $XDG_CACHE_HOME/tilemoe, else ~/.cache/tilemoe; + /gpu_rates.json
std::optional<GpuRates> load_rates(const std::string& path, const std::string& gpu);
void save_rates(const std::string& path, const GpuRates& rates);

}  // namespace tilemoe
