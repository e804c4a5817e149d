// Runs the planned GEMM over and over on fresh row distributions and reports the first launch
// that does not finish within --limit-s, naming the cluster, the skip of padding MMAs, the
// iteration and the distribution. --padding: default, issue, skip-half, skip-all (PaddingMma). Why: the layer bench found launches of the c2x1 planned GEMM
// that never finished (2026-12-04, DeepSeek-V3 and Qwen3 shapes at 16384 tokens), a few in a
// hundred; this tool separates the variants, each in its own process, and counts.
//
//   planned_gemm_stress --cluster c2x1 --padding skip-all --groups 256 --rows 131072 --n 4096 --k 7168
//                       [--skew S] [--epilogue swiglu|store] [--iterations I] [--limit-s L]
// --skew 0 draws each row's group uniformly; S > 0 with weight (g + 1)^-S (the bench's skewed
// routing is about S = 1.5). Exit 0: every launch finished; 3: one stalled; 2: bad arguments.
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "exec/cuda/cuda_check.hpp"
#include "exec/cuda/device_array.hpp"
#include "exec/cuda/moe_kernels.hpp"
#include "exec/cuda/planned_gemm.hpp"

using namespace tilemoe;

namespace {

struct Options {
  cuda::PlannedCluster cluster = cuda::PlannedCluster::M2;
  cuda::PlannedEpilogue epilogue = cuda::PlannedEpilogue::SwiGLU;
  cuda::PaddingMma padding = cuda::PaddingMma::Default;
  int groups = 256, rows = 131072, n = 4096, k = 7168, iterations = 300;
  double skew = 0, limit_s = 10;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "planned_gemm_stress: %s\nusage: planned_gemm_stress [--cluster c2x1|c1x2] [--padding MODE] [--groups G] "
               "[--rows R] [--n N] [--k K] [--skew S] [--epilogue swiglu|store] [--iterations I] [--limit-s L]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(("no value after " + flag).c_str());
    const std::string value = argv[++i];
    if (flag == "--cluster") {
      if (value != "c2x1" && value != "c1x2") usage("--cluster is c2x1 or c1x2");
      o.cluster = value == "c2x1" ? cuda::PlannedCluster::M2 : cuda::PlannedCluster::N2;
    } else if (flag == "--epilogue") {
      if (value != "swiglu" && value != "store") usage("--epilogue is swiglu or store");
      o.epilogue = value == "swiglu" ? cuda::PlannedEpilogue::SwiGLU : cuda::PlannedEpilogue::Store;
    } else if (flag == "--padding") {
      if (value == "default") o.padding = cuda::PaddingMma::Default;
      else if (value == "issue") o.padding = cuda::PaddingMma::Issue;
      else if (value == "skip-half") o.padding = cuda::PaddingMma::SkipHalfTiles;
      else if (value == "skip-all") o.padding = cuda::PaddingMma::SkipAll;
      else usage("--padding is default, issue, skip-half or skip-all");
    } else if (flag == "--groups") {
      o.groups = std::atoi(value.c_str());
    } else if (flag == "--rows") {
      o.rows = std::atoi(value.c_str());
    } else if (flag == "--n") {
      o.n = std::atoi(value.c_str());
    } else if (flag == "--k") {
      o.k = std::atoi(value.c_str());
    } else if (flag == "--iterations") {
      o.iterations = std::atoi(value.c_str());
    } else if (flag == "--skew") {
      o.skew = std::atof(value.c_str());
    } else if (flag == "--limit-s") {
      o.limit_s = std::atof(value.c_str());
    } else {
      usage(("unknown flag " + flag).c_str());
    }
  }
  if (o.groups < 1 || o.rows < 1 || o.n < 16 || o.n % 16 || o.k < 8 || o.k % 8 || o.iterations < 1 || o.skew < 0 ||
      !(o.limit_s > 0)) {
    usage("groups, rows, iterations >= 1; n a multiple of 16; k a multiple of 8; skew >= 0; limit-s > 0");
  }
  return o;
}

// Each row's group drawn from weights (g + 1)^-skew: a fresh distribution per iteration.
std::vector<int> draw_offsets(const Options& o, std::mt19937_64& rng) {
  std::vector<double> weight(static_cast<std::size_t>(o.groups));
  for (int g = 0; g < o.groups; ++g) weight[static_cast<std::size_t>(g)] = std::pow(double(g + 1), -o.skew);
  std::discrete_distribution<int> pick(weight.begin(), weight.end());
  std::vector<int> counts(static_cast<std::size_t>(o.groups), 0);
  for (int r = 0; r < o.rows; ++r) ++counts[static_cast<std::size_t>(pick(rng))];
  std::vector<int> offsets(static_cast<std::size_t>(o.groups) + 1, 0);
  for (int g = 0; g < o.groups; ++g) offsets[static_cast<std::size_t>(g) + 1] = offsets[static_cast<std::size_t>(g)] + counts[static_cast<std::size_t>(g)];
  return offsets;
}

std::string describe(const std::vector<int>& offsets) {
  int empty = 0, small = 0, most = 0;
  for (std::size_t g = 0; g + 1 < offsets.size(); ++g) {
    const int m = offsets[g + 1] - offsets[g];
    empty += m == 0;
    small += m > 0 && m % cuda::kPlannedTileM > 0 && m % cuda::kPlannedTileM <= cuda::kPlannedTileM / 2;
    most = std::max(most, m);
  }
  return std::to_string(empty) + " empty groups, " + std::to_string(small) + " with a last band of <= 64 rows, largest " +
         std::to_string(most) + " rows";
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const char* cluster_name = cuda::planned_cluster_name(o.cluster);
  const char* padding = cuda::padding_mma_name(o.padding);
  try {
    cudaStream_t s;
    TILEMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int n_out = o.epilogue == cuda::PlannedEpilogue::SwiGLU ? o.n / 2 : o.n;
    cuda::DeviceArray<__nv_bfloat16> A(std::size_t(o.rows) * o.k), B(std::size_t(o.groups) * o.n * o.k),
        D(std::size_t(o.rows) * n_out);
    cuda::launch_random_bf16(s, A.data(), A.count(), 1, 1.0f);
    cuda::launch_random_bf16(s, B.data(), B.count(), 2, 1.0f / std::sqrt(float(o.k)));
    cuda::PlannedGemm gemm(o.cluster, o.epilogue, o.groups, 0);
    const std::int64_t capacity = cuda::max_tile_entries(o.rows, o.groups, o.n, o.cluster);
    cuda::DeviceArray<cuda::GemmTileEntry> table(static_cast<std::size_t>(capacity));
    cuda::DeviceArray<int> count(1);
    cudaEvent_t done;
    TILEMOE_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    std::mt19937_64 rng(std::random_device{}());
    std::printf("planned_gemm_stress: %s, padding MMAs %s, %d groups, %d rows, N %d, K %d, skew %.2f, %d iterations, %d CTAs\n",
                cluster_name, padding, o.groups, o.rows, o.n, o.k, o.skew, o.iterations, gemm.grid_ctas());
    const auto started = std::chrono::steady_clock::now();
    for (int it = 0; it < o.iterations; ++it) {
      const std::vector<int> offsets = draw_offsets(o, rng);
      const auto host_table = cuda::build_tile_table(offsets, o.n, o.cluster, cuda::TileFlags::None);
      const int entries = static_cast<int>(host_table.size());
      // the host copies wait for the previous launch: they are where a stalled launch would block
      TILEMOE_CUDA_CHECK(cudaMemcpyAsync(table.data(), host_table.data(), host_table.size() * sizeof(host_table[0]),
                                         cudaMemcpyHostToDevice, s));
      TILEMOE_CUDA_CHECK(cudaMemcpyAsync(count.data(), &entries, 4, cudaMemcpyHostToDevice, s));
      cuda::PlannedGemmRun r;
      r.table = table.data();
      r.count = count.data();
      r.A = A.data();
      r.a_rows = o.rows;
      r.B = B.data();
      r.groups = o.groups;
      r.D = D.data();
      r.N = o.n;
      r.K = o.k;
      r.padding_mma = o.padding;
      gemm.run(s, r);
      TILEMOE_CUDA_CHECK(cudaEventRecord(done, s));
      const auto launched = std::chrono::steady_clock::now();
      for (;;) {
        const cudaError_t q = cudaEventQuery(done);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady) TILEMOE_CUDA_CHECK(q);
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - launched).count();
        if (waited > o.limit_s) {
          std::printf("planned_gemm_stress: STALL: launch %d of %d (%s, padding MMAs %s, %d entries) has not finished after %.0f s; "
                      "%s\n",
                      it + 1, o.iterations, cluster_name, padding, entries, waited, describe(offsets).c_str());
          std::fflush(stdout);
          std::_Exit(3);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::printf("planned_gemm_stress: %s, padding MMAs %s: %d of %d launches finished (%.1f s)\n", cluster_name, padding,
                o.iterations, o.iterations, wall);
    cudaEventDestroy(done);
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "planned_gemm_stress: %s\n", e.what());
    return 1;
  }
  return 0;
}
