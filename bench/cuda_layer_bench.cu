// Benchmark of the one-GPU MoE layer: per stage and total, against the roofline floor and a
// per-expert cuBLAS loop, with the matrix and copy rates measured in the same run.
// CUDA events after warm-up, median of >= 20 runs, inputs rotated through more than the L2,
// random data. Prints a table and writes JSON lines to --json FILE. The cases are the one-GPU
// perf cases of the registry (tests/cases); --case ID (repeatable, e.g. mixtral-8x7b:16384)
// restricts the sweep to those (for a profiler, or a look at the targets), --list names them;
// --raster adds a sweep of GEMM0's band blocks; a phase that runs past --stall-limit-s (60 s)
// ends the bench with exit code 3 and a message naming it.
// Alongside each case: the SM clock and power while it was timed (NVML), the same FLOPs as one
// dense cuBLAS product per GEMM, and the floor of the tiles actually computed (each expert's
// rows padded to the 128-row tile).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "moe_cases.hpp"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/cuda/device_array.hpp"
#include "core/cuda/event_timing.hpp"
#include "kernels/gemm/stock/grouped_gemm.hpp"
#include "tilemoe/cuda/layer_timing.hpp"
#include "kernels/moe_kernels.hpp"
#include "kernels/gemm/planned/planned_gemm.hpp"
#include "tilemoe/cuda/moe_layer.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/median.hpp"
#include "gpu_clock_sampler.hpp"
#include "phase_watchdog.hpp"

using namespace tilemoe;

namespace {

#define CUBLAS_CHECK(call)                                                                   \
  do {                                                                                       \
    const cublasStatus_t s_ = (call);                                                        \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                       \
      std::fprintf(stderr, "cuBLAS error %d in %s at %s:%d\n", int(s_), #call, __FILE__, __LINE__); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    TILEMOE_CUDA_CHECK(cudaEventCreate(&a));
    TILEMOE_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~Timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  template <typename F>
  double ms(cudaStream_t s, F&& f) {
    TILEMOE_CUDA_CHECK(cudaEventRecord(a, s));
    f();
    TILEMOE_CUDA_CHECK(cudaEventRecord(b, s));
    TILEMOE_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    TILEMOE_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    return t;
  }
};

// D[M][N] = A[M][K] * B[N][K]^T, row-major, through cuBLAS (column-major: D^T = B A^T).
void cublas_gemm(cublasHandle_t h, const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* D, int M, int N, int K) {
  const float one = 1.0f, zero = 0.0f;
  CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, B, CUDA_R_16BF, K, A, CUDA_R_16BF, K, &zero, D,
                            CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

struct Rates {
  double matrix_tflops = 0, copy_gbps = 0;
  bench::GpuClockSampler::Summary matrix_clock;
};

Rates measure_rates(cudaStream_t s, cublasHandle_t h, bench::GpuClockSampler& clock) {
  Rates r;
  const int n = 8192;
  __nv_bfloat16 *a, *b, *c;
  TILEMOE_CUDA_CHECK(cudaMalloc(&a, std::size_t(n) * n * 2));
  TILEMOE_CUDA_CHECK(cudaMalloc(&b, std::size_t(n) * n * 2));
  TILEMOE_CUDA_CHECK(cudaMalloc(&c, std::size_t(n) * n * 2));
  cuda::launch_random_bf16(s, a, std::size_t(n) * n, 11, 1.0f);
  cuda::launch_random_bf16(s, b, std::size_t(n) * n, 12, 1.0f);
  Timer t;
  std::vector<double> times;
  clock.start();
  for (int i = 0; i < 13; ++i) {
    const double ms = t.ms(s, [&] { cublas_gemm(h, a, b, c, n, n, n); });
    if (i >= 3) times.push_back(ms);
  }
  r.matrix_clock = clock.stop();
  r.matrix_tflops = 2.0 * n * n * double(n) / (median(times) * 1e-3) / 1e12;
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  const std::size_t bytes = std::size_t(4) << 30;
  char *src, *dst;
  TILEMOE_CUDA_CHECK(cudaMalloc(&src, bytes));
  TILEMOE_CUDA_CHECK(cudaMalloc(&dst, bytes));
  TILEMOE_CUDA_CHECK(cudaMemset(src, 1, bytes));
  times.clear();
  for (int i = 0; i < 13; ++i) {
    const double ms = t.ms(s, [&] { TILEMOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s)); });
    if (i >= 3) times.push_back(ms);
  }
  r.copy_gbps = 2.0 * double(bytes) / (median(times) * 1e-3) / 1e9;  // read + write
  cudaFree(src);
  cudaFree(dst);
  return r;
}

struct Shape {
  const char* name;
  int hidden, ffn, experts, top_k;
};


}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  std::vector<std::string> only_ids;
  bool quick = false, raster_sweep = false, list = false;
  double stall_limit_s = 60;
  std::string only_routing;  // empty: both
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--raster")) {
      raster_sweep = true;
    } else if (!std::strcmp(argv[i], "--routing") && i + 1 < argc) {
      only_routing = argv[++i];
      if (only_routing != "balanced" && only_routing != "skewed") {
        std::fprintf(stderr, "--routing wants balanced or skewed, not '%s'\n", only_routing.c_str());
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--stall-limit-s") && i + 1 < argc) {
      const char* text = argv[++i];
      char* end = nullptr;
      stall_limit_s = std::strtod(text, &end);
      if (end == text || *end != '\0' || !(stall_limit_s > 0 && stall_limit_s <= 3600)) {
        std::fprintf(stderr, "--stall-limit-s wants seconds in (0, 3600], not '%s'\n", text);
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--case") && i + 1 < argc) {
      only_ids.emplace_back(argv[++i]);
    } else if (!std::strcmp(argv[i], "--list")) {
      list = true;
    } else {
      std::fprintf(stderr, "usage: cuda_layer_bench [--json FILE] [--quick] [--case ID ...] [--list] [--routing balanced|skewed] [--raster]"
                   " [--stall-limit-s S]"
                   " (unknown: %s)\n",
                   argv[i]);
      return 2;
    }
  }
  std::vector<cases::MoeCase> chosen;
  try {
    chosen = cases::select_cases(false, cases::kPerf, only_ids);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  if (quick && only_ids.empty()) std::erase_if(chosen, [](const cases::MoeCase& c) { return !c.quick; });
  if (list) {
    for (const cases::MoeCase& c : chosen) std::printf("%s\n", c.id().c_str());
    return 0;
  }
  FILE* json = json_path.empty() ? nullptr : std::fopen(json_path.c_str(), "w");
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a cut-off call still shows how far the sweep got
  try {
    cudaStream_t s;
    TILEMOE_CUDA_CHECK(cudaStreamCreate(&s));
    cublasHandle_t h;
    CUBLAS_CHECK(cublasCreate(&h));
    CUBLAS_CHECK(cublasSetStream(h, s));
    int device = 0;
    TILEMOE_CUDA_CHECK(cudaGetDevice(&device));
    bench::GpuClockSampler clock(device);
    // No phase of a case takes more than seconds; one that runs past the limit is a stall, reported by name.
    bench::PhaseWatchdog watchdog("cuda_layer_bench", stall_limit_s, [&clock] { return clock.snapshot(); });
    std::string case_label;
    auto watch = [&](const std::string& what) { watchdog.enter(case_label + what); };
    watch("measuring the cuBLAS and copy rates");
    const Rates rates = measure_rates(s, h, clock);
    std::printf("measured rates: cuBLAS bf16 8192^3 %.0f TFLOP/s (SM clock %.0f MHz, %.0f W), device copy %.0f GB/s (read + write)\n",
                rates.matrix_tflops, rates.matrix_clock.mean_sm_mhz, rates.matrix_clock.mean_watts, rates.copy_gbps);
    if (!clock.available()) std::printf("(NVML not found: no clock or power samples)\n");
    if (json) {
      std::fprintf(json, "{\"kind\":\"rates\",\"matrix_tflops\":%.1f,\"copy_gbps\":%.1f,\"matrix_clock\":%s}\n",
                   rates.matrix_tflops, rates.copy_gbps, bench::GpuClockSampler::json(rates.matrix_clock).c_str());
    }

    std::printf("%-14s %6s %-8s | %8s %8s %8s %8s %8s %8s %8s | %9s %7s %7s | %9s %9s %6s\n", "shape", "tokens", "routing",
                "router", "layout", "permute", "gemm0", "act", "gemm1", "combine", "total ms", "TFLOP/s", "x floor",
                "ffn ms", "cublas ffn", "ratio");
    std::printf("(stock: the same layer on CUTLASS's stock grouped kernels + a separate activation: total, ffn ms)\n");
    for (const cases::MoeCase& c : chosen) {
      const Shape shape{c.name.c_str(), static_cast<int>(c.hidden), static_cast<int>(c.ffn), static_cast<int>(c.experts),
                        static_cast<int>(c.top_k)};
      {
        const int tokens = static_cast<int>(c.tokens);
        const std::string shape_label = std::string(shape.name) + " " + std::to_string(tokens) + ": ";
        case_label = shape_label;
        watch("building the layers (random weights on the device)");
        MoeConfig config;
        config.tokens = tokens;
        config.hidden = shape.hidden;
        config.ffn_hidden = shape.ffn;
        config.num_experts = shape.experts;
        config.top_k = shape.top_k;
        cuda::MoeLayer layer(config, cuda::RandomDeviceWeights{7});
        // the same layer on CUTLASS's stock kernels + a separate activation kernel (same weights)
        cuda::MoeLayer stock_layer(config, cuda::RandomDeviceWeights{7}, 0, {cuda::GemmPath::Stock});
        float* logits;
        TILEMOE_CUDA_CHECK(cudaMalloc(&logits, std::size_t(tokens) * shape.experts * 4));
        for (const char* routing : {"balanced", "skewed"}) {
          if (!only_routing.empty() && only_routing != routing) continue;
          std::vector<float> host_logits(std::size_t(tokens) * shape.experts);
          std::mt19937_64 rng(tokens * 31 + shape.experts);
          std::normal_distribution<float> normal(0.0f, 1.0f);
          for (std::size_t i = 0; i < host_logits.size(); ++i) {
            const int e = static_cast<int>(i % shape.experts);
            host_logits[i] = normal(rng) - (routing[0] == 's' ? 1.5f * std::log(float(e + 1)) : 0.0f);
          }
          case_label = std::string(shape.name) + " " + std::to_string(tokens) + " " + routing + ": ";
          watch("uploading the logits");
          TILEMOE_CUDA_CHECK(cudaMemcpy(logits, host_logits.data(), host_logits.size() * 4, cudaMemcpyHostToDevice));
          watch("timing the layer on the stock kernels");
          const cuda::LayerTiming stock_timing = cuda::time_layer_forward(stock_layer, logits, tokens, 25, s);
          watch("timing the layer (planned GEMMs)");
          clock.start();
          const cuda::LayerTiming timing = cuda::time_layer_forward(layer, logits, tokens, 25, s);
          watch("joining the NVML sampler");
          const bench::GpuClockSampler::Summary layer_clock = clock.stop();
          watch("timing the per-expert cuBLAS loop");
          // the cuBLAS per-expert loop on the same permuted rows (host needs the counts: baseline only)
          std::vector<int> offsets(shape.experts + 1);
          TILEMOE_CUDA_CHECK(cudaMemcpy(offsets.data(), layer.row_offset(), offsets.size() * 4, cudaMemcpyDeviceToHost));
          const std::size_t R = std::size_t(tokens) * shape.top_k;
          __nv_bfloat16 *hbuf, *abuf, *ybuf;
          TILEMOE_CUDA_CHECK(cudaMalloc(&hbuf, R * 2 * shape.ffn * 2));
          TILEMOE_CUDA_CHECK(cudaMalloc(&abuf, R * shape.ffn * 2));
          TILEMOE_CUDA_CHECK(cudaMalloc(&ybuf, R * shape.hidden * 2));
          Timer timer;
          std::vector<double> cublas_ffn;
          for (int run = 0; run < 13; ++run) {
            const double ms = timer.ms(s, [&] {
              for (int e = 0; e < shape.experts; ++e) {
                const int m = offsets[e + 1] - offsets[e];
                if (m == 0) continue;
                cublas_gemm(h, layer.permuted_rows() + std::size_t(offsets[e]) * shape.hidden,
                            layer.expert_weights0() + std::size_t(e) * 2 * shape.ffn * shape.hidden,
                            hbuf + std::size_t(offsets[e]) * 2 * shape.ffn, m, 2 * shape.ffn, shape.hidden);
              }
              cuda::launch_activation(s, hbuf, static_cast<int>(R), shape.ffn, false, abuf);
              for (int e = 0; e < shape.experts; ++e) {
                const int m = offsets[e + 1] - offsets[e];
                if (m == 0) continue;
                cublas_gemm(h, abuf + std::size_t(offsets[e]) * shape.ffn,
                            layer.expert_weights2() + std::size_t(e) * shape.hidden * shape.ffn,
                            ybuf + std::size_t(offsets[e]) * shape.hidden, m, shape.hidden, shape.ffn);
              }
            });
            if (run >= 3) cublas_ffn.push_back(ms);
          }
          // The same FLOPs as one dense product per GEMM (all R rows against expert 0's weights):
          // what cuBLAS gives at this size and this clock, with no grouping and no routing.
          watch("timing the dense cuBLAS products");
          std::vector<double> dense0, dense1;
          clock.start();
          for (int run = 0; run < 23; ++run) {
            const double a = timer.ms(s, [&] {
              cublas_gemm(h, layer.permuted_rows(), layer.expert_weights0(), hbuf, int(R), 2 * shape.ffn, shape.hidden);
            });
            const double b = timer.ms(s, [&] {
              cublas_gemm(h, abuf, layer.expert_weights2(), ybuf, int(R), shape.hidden, shape.ffn);
            });
            if (run >= 3) dense0.push_back(a), dense1.push_back(b);
          }
          const bench::GpuClockSampler::Summary dense_clock = clock.stop();
          // each GEMM configuration on the same rows, to calibrate the choice of MoeLayer
          std::string config_report;
          bool first_config = true;
          for (cuda::GemmConfig config : cuda::kAllGemmConfigs) {
            watch(std::string("timing the stock GEMM config ") + cuda::gemm_config_name(config));
            cuda::GroupedGemm g0(config, shape.experts, 0), g1(config, shape.experts, 0);
            std::vector<double> t0, t1;
            for (int run = 0; run < 13; ++run) {
              const double a = timer.ms(s, [&] {
                g0.run(s, shape.experts, layer.row_offset(), layer.permuted_rows(), layer.expert_weights0(), hbuf, 2 * shape.ffn, shape.hidden);
              });
              const double b = timer.ms(s, [&] {
                g1.run(s, shape.experts, layer.row_offset(), abuf, layer.expert_weights2(), ybuf, shape.hidden, shape.ffn);
              });
              if (run >= 3) t0.push_back(a), t1.push_back(b);
            }
            char text[160];
            std::snprintf(text, sizeof text, "%s\"%s\":[%.4f,%.4f]", first_config ? "" : ",", cuda::gemm_config_name(config),
                          median(t0), median(t1));
            first_config = false;
            config_report += text;
          }
          // The planned GEMM's ready-flag hook: the same tiles with no flag, with one release add
          // per tile, and with a flag plus two timestamps per tile; both clusters.
          std::string planned_report;
          for (cuda::PlannedCluster cl : {cuda::PlannedCluster::M2, cuda::PlannedCluster::N2}) {
            watch(std::string("timing the planned GEMMs alone, cluster ") + cuda::planned_cluster_name(cl));
            cuda::PlannedGemm p0(cl, cuda::PlannedEpilogue::SwiGLU, shape.experts, 0);
            cuda::PlannedGemm p1(cl, cuda::PlannedEpilogue::Store, shape.experts, 0);
            const auto t0_none = cuda::build_tile_table(offsets, 2 * shape.ffn, cl, cuda::TileFlags::None);
            const auto t0_flag = cuda::build_tile_table(offsets, 2 * shape.ffn, cl, cuda::TileFlags::PerTile);
            const auto t1_none = cuda::build_tile_table(offsets, shape.hidden, cl, cuda::TileFlags::None);
            const auto t1_flag = cuda::build_tile_table(offsets, shape.hidden, cl, cuda::TileFlags::PerTile);
            const std::size_t most = std::max(t0_flag.size(), t1_flag.size());
            cuda::DeviceArray<cuda::GemmTileEntry> d_table(most);
            cuda::DeviceArray<int> d_count(1);
            cuda::DeviceArray<unsigned> d_flags(most);
            cuda::DeviceArray<unsigned long long> d_times(2 * most);
            TILEMOE_CUDA_CHECK(cudaMemset(d_flags.data(), 0, most * 4));
            auto time_table = [&](cuda::PlannedGemm& g, const std::vector<cuda::GemmTileEntry>& t, bool gemm0, bool times,
                                  cuda::PaddingMma padding_mma = cuda::PaddingMma::Default,
                                  cuda::ItemFetch fetch = cuda::ItemFetch::Default) {
              watch(std::string("timing the planned ") + (gemm0 ? "GEMM0" : "GEMM1") + " alone, cluster " +
                    cuda::planned_cluster_name(cl) + (times ? ", with tile times" : "") +
                    ", padding MMAs " + cuda::padding_mma_name(padding_mma) + ", " + cuda::item_fetch_name(fetch) +
                    " fetch (" + std::to_string(t.size()) + " entries)");
              const int n = static_cast<int>(t.size());
              TILEMOE_CUDA_CHECK(cudaMemcpy(d_table.data(), t.data(), t.size() * sizeof(t[0]), cudaMemcpyHostToDevice));
              TILEMOE_CUDA_CHECK(cudaMemcpy(d_count.data(), &n, 4, cudaMemcpyHostToDevice));
              cuda::PlannedGemmRun r;
              r.table = d_table.data();
              r.count = d_count.data();
              r.a_rows = static_cast<int>(R);
              r.groups = shape.experts;
              r.A = gemm0 ? layer.permuted_rows() : abuf;
              r.B = gemm0 ? layer.expert_weights0() : layer.expert_weights2();
              r.D = gemm0 ? abuf : ybuf;
              r.N = gemm0 ? 2 * shape.ffn : shape.hidden;
              r.K = gemm0 ? shape.hidden : shape.ffn;
              r.flags = d_flags.data();
              r.tile_times = times ? d_times.data() : nullptr;
              r.padding_mma = padding_mma;
              r.item_fetch = fetch;
              return double(cuda::median_event_ms(s, 10, 3, [&] { g.run(s, r); }));
            };
            // Interleaved variants, so drift between them does not read as a cost. The default, the
            // all-MMA variant (every warp group issues its MMAs, padding rows or not) and the other
            // item fetch (the default padding MMAs) are each timed twice, in mirrored places of
            // the sequence, and each reported as its better run.
            constexpr cuda::PaddingMma kAllMma = cuda::PaddingMma::Issue;
            constexpr cuda::PaddingMma kPad = cuda::PaddingMma::Default;
            constexpr cuda::ItemFetch kStatic = cuda::ItemFetch::Static, kDynamic = cuda::ItemFetch::Dynamic;
            const double g0_none = time_table(p0, t0_none, true, false), g0_all = time_table(p0, t0_none, true, false, kAllMma);
            const double g0_static = time_table(p0, t0_none, true, false, kPad, kStatic);
            const double g0_dynamic = time_table(p0, t0_none, true, false, kPad, kDynamic);
            const double g0_flag = time_table(p0, t0_flag, true, false);
            const double g1_none = time_table(p1, t1_none, false, false), g1_all = time_table(p1, t1_none, false, false, kAllMma);
            const double g1_static = time_table(p1, t1_none, false, false, kPad, kStatic);
            const double g1_dynamic = time_table(p1, t1_none, false, false, kPad, kDynamic);
            const double g1_flag = time_table(p1, t1_flag, false, false);
            const double g1_trace = time_table(p1, t1_flag, false, true);
            const double g0_dynamic2 = time_table(p0, t0_none, true, false, kPad, kDynamic);
            const double g0_static2 = time_table(p0, t0_none, true, false, kPad, kStatic);
            const double g0_all2 = time_table(p0, t0_none, true, false, kAllMma), g0_none2 = time_table(p0, t0_none, true, false);
            const double g1_dynamic2 = time_table(p1, t1_none, false, false, kPad, kDynamic);
            const double g1_static2 = time_table(p1, t1_none, false, false, kPad, kStatic);
            const double g1_all2 = time_table(p1, t1_none, false, false, kAllMma), g1_none2 = time_table(p1, t1_none, false, false);
            const double g0_all_mma = std::min(g0_all, g0_all2), g1_all_mma = std::min(g1_all, g1_all2);
            // With --raster: the raster of GEMM0's table, its bands in blocks of 4, 8, 16 (each block
            // N tiles outer, bands fastest) instead of the whole group at once: how much of the L2
            // the concurrent tiles share.
            std::string raster;
            if (raster_sweep) {
              for (int band_block : {4, 8, 16}) {
                const auto t = cuda::build_tile_table(offsets, 2 * shape.ffn, cl, cuda::TileFlags::None, band_block);
                char cell[64];
                std::snprintf(cell, sizeof cell, "%s\"%d\":%.4f", raster.empty() ? "" : ",", band_block,
                              time_table(p0, t, true, false));
                raster += cell;
              }
            }
            char text[640];
            std::snprintf(text, sizeof text,
                          "%s\"%s\":{\"gemm0_ms\":%.4f,\"gemm0_flags_ms\":%.4f,\"gemm1_ms\":%.4f,\"gemm1_flags_ms\":%.4f,"
                          "\"gemm1_flags_times_ms\":%.4f,\"gemm0_all_mma_ms\":%.4f,\"gemm1_all_mma_ms\":%.4f,"
                          "\"gemm0_static_ms\":%.4f,\"gemm1_static_ms\":%.4f,\"gemm0_dynamic_ms\":%.4f,"
                          "\"gemm1_dynamic_ms\":%.4f,\"gemm0_band_block_ms\":{%s}}",
                          planned_report.empty() ? "" : ",", cuda::planned_cluster_name(cl), std::min(g0_none, g0_none2),
                          g0_flag, std::min(g1_none, g1_none2), g1_flag, g1_trace, g0_all_mma, g1_all_mma,
                          std::min(g0_static, g0_static2), std::min(g1_static, g1_static2), std::min(g0_dynamic, g0_dynamic2),
                          std::min(g1_dynamic, g1_dynamic2), raster.c_str());
            planned_report += text;
          }
          watch("freeing the case's buffers");
          cudaFree(hbuf);
          cudaFree(abuf);
          cudaFree(ybuf);
          int used_experts = 0;
          for (int e = 0; e < shape.experts; ++e) used_experts += offsets[e + 1] > offsets[e];
          const double H = shape.hidden, F = shape.ffn;
          const double flops = 2.0 * R * H * 2 * F + 2.0 * R * F * H;
          const double weight_bytes = used_experts * (2 * F * H + H * F) * 2.0;
          // the traffic of a layer with SwiGLU fused into GEMM0: x read, out written, the permuted
          // rows, the activation and the expert outputs each written once and read once (bf16)
          const double act_bytes = 2.0 * (2.0 * tokens * H + 4.0 * R * H + 2.0 * R * F);
          const double floor_ms = std::max(flops / (rates.matrix_tflops * 1e12), (weight_bytes + act_bytes) / (rates.copy_gbps * 1e9)) * 1e3;
          // The tiles actually computed: each used expert's rows rounded up to the 128-row tile.
          double padded_rows = 0;
          for (int e = 0; e < shape.experts; ++e) {
            const int m = offsets[e + 1] - offsets[e];
            padded_rows += double((m + cuda::kPlannedTileM - 1) / cuda::kPlannedTileM) * cuda::kPlannedTileM;
          }
          const double tile_flops = 2.0 * padded_rows * H * 2 * F + 2.0 * padded_rows * F * H;
          const double ffn_floor_ms = std::max(flops / (rates.matrix_tflops * 1e12), weight_bytes / (rates.copy_gbps * 1e9)) * 1e3;
          const double tile_floor_ms = std::max(tile_flops / (rates.matrix_tflops * 1e12), weight_bytes / (rates.copy_gbps * 1e9)) * 1e3;
          const double total_ms = timing.total_ms;
          const double ffn_ms = timing.stage_ms[cuda::kGemm0] + timing.stage_ms[cuda::kActivation] + timing.stage_ms[cuda::kGemm1];
          std::printf("%-14s %6d %-8s |", shape.name, tokens, routing);
          for (int st = 0; st < cuda::kStageCount; ++st) std::printf(" %8.3f", timing.stage_ms[st]);
          std::printf(" | %9.3f %7.0f %7.2f | %9.3f %9.3f %6.2f | stock %9.3f %9.3f\n", total_ms, flops / (total_ms * 1e-3) / 1e12,
                      total_ms / floor_ms, ffn_ms, median(cublas_ffn), median(cublas_ffn) / ffn_ms, stock_timing.total_ms,
                      stock_timing.stage_ms[cuda::kGemm0] + stock_timing.stage_ms[cuda::kActivation] + stock_timing.stage_ms[cuda::kGemm1]);
          std::printf("    dense cuBLAS of the same FLOPs %.3f + %.3f ms (%.0f MHz); layer timed at %.0f MHz (min %.0f), %.0f W;"
                      " FFN floor %.3f ms, floor of the padded tiles %.3f ms (%.2fx the rows)\n",
                      median(dense0), median(dense1), dense_clock.mean_sm_mhz, layer_clock.mean_sm_mhz, layer_clock.min_sm_mhz,
                      layer_clock.mean_watts, ffn_floor_ms, tile_floor_ms, padded_rows / double(R));
          if (json) {
            std::fprintf(json, "{\"kind\":\"layer\",\"shape\":\"%s\",\"tokens\":%d,\"routing\":\"%s\",\"total_ms\":%.4f,\"floor_ms\":%.4f,"
                         "\"ffn_ms\":%.4f,\"cublas_loop_ffn_ms\":%.4f,\"flops\":%.4e,\"bytes\":%.4e",
                         shape.name, tokens, routing, total_ms, floor_ms, ffn_ms, median(cublas_ffn), flops, weight_bytes + act_bytes);
            for (int st = 0; st < cuda::kStageCount; ++st) std::fprintf(json, ",\"%s_ms\":%.4f", cuda::stage_name(st), timing.stage_ms[st]);
            std::fprintf(json, ",\"gemm_configs_ms\":{%s}", config_report.c_str());
            std::fprintf(json, ",\"dense_gemm0_ms\":%.4f,\"dense_gemm1_ms\":%.4f,\"dense_clock\":%s,\"layer_clock\":%s",
                         median(dense0), median(dense1), bench::GpuClockSampler::json(dense_clock).c_str(),
                         bench::GpuClockSampler::json(layer_clock).c_str());
            std::fprintf(json, ",\"ffn_floor_ms\":%.4f,\"padded_rows\":%.0f,\"tile_flops\":%.4e,\"tile_ffn_floor_ms\":%.4f",
                         ffn_floor_ms, padded_rows, tile_flops, tile_floor_ms);
            std::fprintf(json, ",\"planned_ms\":{%s}", planned_report.c_str());
            std::fprintf(json, ",\"gemm\":\"%s\",\"stock_total_ms\":%.4f,\"stock_ffn_ms\":%.4f", layer.gemm_description().c_str(),
                         stock_timing.total_ms,
                         stock_timing.stage_ms[cuda::kGemm0] + stock_timing.stage_ms[cuda::kActivation] + stock_timing.stage_ms[cuda::kGemm1]);
            std::fprintf(json, "}\n");
            std::fflush(json);
          }
        }
        case_label = shape_label;
        watch("freeing the logits and the layers");
        cudaFree(logits);
      }
    }
    case_label.clear();
    watch("finishing");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench failed: %s\n", e.what());
    return 1;
  }
  if (json) std::fclose(json);
  return 0;
}
