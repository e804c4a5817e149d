// Runs the planned GEMM over and over on fresh row distributions and reports the first launch
// that does not finish within --limit-s, naming the cluster, the padding-MMA mode (--padding:
// default, issue, skip-half, skip-all; see PaddingMma), the item fetch (--fetch: default,
// static, dynamic; see ItemFetch), the iteration and the distribution.
// Why: the layer bench found launches of the c2x1 planned GEMM that never finished (2026-12-04, DeepSeek-V3 and Qwen3 shapes at 16384 tokens), a few in a
// hundred; this tool separates the variants, each in its own process, and counts.
//
//   planned_gemm_stress --cluster c2x1 --padding skip-all --groups 256 --rows 131072 --n 4096 --k 7168
//                       [--fetch F] [--sm-limit S] [--seed N] [--skew S] [--epilogue swiglu|store] [--iterations I]
//                       [--limit-s L] [--probe]
// --skew 0 draws each row's group uniformly; S > 0 with weight (g + 1)^-S (the bench's skewed
// routing is about S = 1.5). Exit 0: every launch finished; 3: one stalled; 2: bad arguments;
// 1: a CUDA error. --probe has the kernel record where each role of each CTA is
// (planned_gemm_probe.hpp) in mapped host memory; a stalled launch then prints two snapshots'
// account, a few seconds apart: which waits the roles sit in, and whether anything still moves.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/cuda/bounded_sync.hpp"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/cuda/device_array.hpp"
#include "kernels/moe_kernels.hpp"
#include "kernels/gemm/planned/planned_gemm.hpp"
#include "kernels/gemm/planned/planned_gemm_probe.hpp"

using namespace tilemoe;

namespace {

struct Options {
  cuda::PlannedCluster cluster = cuda::PlannedCluster::M2;
  cuda::PlannedEpilogue epilogue = cuda::PlannedEpilogue::SwiGLU;
  cuda::PaddingMma padding = cuda::PaddingMma::Default;
  cuda::ItemFetch fetch = cuda::ItemFetch::Default;
  int sm_limit = 0;
  unsigned long long seed = 0;  // 0: a fresh one, printed
  int groups = 256, rows = 131072, n = 4096, k = 7168, iterations = 300;
  double skew = 0, limit_s = 10;
  bool probe = false;
};

// Typed options with ranges (CLI11): a bad value is refused with exit code 2, never read as 0.
Options parse(int argc, char** argv) {
  Options o;
  CLI::App app{"planned_gemm_stress: the planned GEMM launched over and over, each launch's wait bounded"};
  const std::map<std::string, cuda::PlannedCluster> clusters{{"c2x1", cuda::PlannedCluster::M2},
                                                             {"c1x2", cuda::PlannedCluster::N2}};
  const std::map<std::string, cuda::PlannedEpilogue> epilogues{{"swiglu", cuda::PlannedEpilogue::SwiGLU},
                                                               {"store", cuda::PlannedEpilogue::Store}};
  const std::map<std::string, cuda::PaddingMma> paddings{{"default", cuda::PaddingMma::Default},
                                                         {"issue", cuda::PaddingMma::Issue},
                                                         {"skip-half", cuda::PaddingMma::SkipHalfTiles},
                                                         {"skip-all", cuda::PaddingMma::SkipAll}};
  app.add_option("--cluster", o.cluster, "c2x1 or c1x2")->transform(CLI::CheckedTransformer(clusters));
  app.add_option("--epilogue", o.epilogue, "swiglu or store")->transform(CLI::CheckedTransformer(epilogues));
  app.add_option("--padding", o.padding, "padding MMAs: default, issue, skip-half, skip-all")
      ->transform(CLI::CheckedTransformer(paddings));
  const std::map<std::string, cuda::ItemFetch> fetches{{"default", cuda::ItemFetch::Default},
                                                       {"static", cuda::ItemFetch::Static},
                                                       {"dynamic", cuda::ItemFetch::Dynamic}};
  app.add_option("--fetch", o.fetch, "item fetch: default, static, dynamic")->transform(CLI::CheckedTransformer(fetches));
  app.add_option("--sm-limit", o.sm_limit, "SMs the GEMM may use (0: all)")->check(CLI::Range(0, 1024));
  app.add_option("--seed", o.seed, "seed of the row distributions (0: a fresh one)");
  app.add_option("--groups", o.groups, "groups (experts)")->check(CLI::Range(1, 4096));
  app.add_option("--rows", o.rows, "rows of A")->check(CLI::Range(1, 1 << 24));
  app.add_option("--n", o.n, "N (a multiple of 16)")->check(CLI::Range(16, 1 << 16));
  app.add_option("--k", o.k, "K (a multiple of 8)")->check(CLI::Range(8, 1 << 16));
  app.add_option("--iterations", o.iterations, "launches")->check(CLI::Range(1, 1 << 20));
  app.add_option("--skew", o.skew, "0: uniform groups; S > 0: weight (g + 1)^-S")->check(CLI::Range(0.0, 16.0));
  app.add_option("--limit-s", o.limit_s, "seconds a launch may take")->check(CLI::Range(0.001, 3600.0));
  app.add_flag("--probe", o.probe, "record where each CTA's roles are; a stall prints where they wait");
  try {
    app.parse(argc, argv);
    if (o.n % 16 != 0 || o.k % 8 != 0) throw CLI::ValidationError("--n must be a multiple of 16 and --k of 8");
  } catch (const CLI::Error& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
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
  // "skip-all, dynamic fetch": the variant every line names
  const std::string variant_text = std::string(cuda::padding_mma_name(o.padding)) + ", " + cuda::item_fetch_name(o.fetch) + " fetch";
  const char* variant = variant_text.c_str();
  try {
    cudaStream_t s;
    TILEMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int n_out = o.epilogue == cuda::PlannedEpilogue::SwiGLU ? o.n / 2 : o.n;
    cuda::DeviceArray<__nv_bfloat16> A(std::size_t(o.rows) * o.k), B(std::size_t(o.groups) * o.n * o.k),
        D(std::size_t(o.rows) * n_out);
    cuda::launch_random_bf16(s, A.data(), A.count(), 1, 1.0f);
    cuda::launch_random_bf16(s, B.data(), B.count(), 2, 1.0f / std::sqrt(float(o.k)));
    cuda::PlannedGemm gemm(o.cluster, o.epilogue, o.groups, 0, o.sm_limit);
    const std::int64_t capacity = cuda::max_tile_entries(o.rows, o.groups, o.n, o.cluster);
    cuda::DeviceArray<cuda::GemmTileEntry> table(static_cast<std::size_t>(capacity));
    cuda::DeviceArray<int> count(1);
    const unsigned long long seed =
        o.seed != 0 ? o.seed : (static_cast<unsigned long long>(std::random_device{}()) << 32) | std::random_device{}();
    std::mt19937_64 rng(seed);
    std::unique_ptr<cuda::MappedProbe> probe;  // readable here while a launch is stalled
    if (o.probe) probe = std::make_unique<cuda::MappedProbe>(gemm.grid_ctas());
    std::printf("planned_gemm_stress: %s, padding MMAs %s, %d groups, %d rows, N %d, K %d, skew %.2f, %d iterations, %d CTAs, "
                "seed %llu\n",
                cluster_name, variant, o.groups, o.rows, o.n, o.k, o.skew, o.iterations, gemm.grid_ctas(), seed);
    const auto started = std::chrono::steady_clock::now();
    for (int it = 0; it < o.iterations; ++it) {
      const std::vector<int> offsets = draw_offsets(o, rng);
      const auto host_table = cuda::build_tile_table(offsets, o.n, o.cluster, cuda::TileFlags::None);
      const int entries = static_cast<int>(host_table.size());
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
      r.item_fetch = o.fetch;
      if (probe) {
        probe->clear();  // the last launch finished
        r.probe = probe->device();
      }
      gemm.run(s, r);
      const auto limit = std::chrono::milliseconds(static_cast<long long>(o.limit_s * 1000));
      if (!cuda::wait_for_stream(s, limit)) {
        std::printf("planned_gemm_stress: STALL: launch %d of %d (%s, padding MMAs %s, %d entries) has not finished after %.1f s; "
                    "%s\n",
                    it + 1, o.iterations, cluster_name, variant, entries, o.limit_s, describe(offsets).c_str());
        if (probe) {
          const auto first = probe->snapshot();
          std::this_thread::sleep_for(std::chrono::seconds(3));
          std::printf("%s", cuda::describe_probe(first, probe->snapshot(), host_table).c_str());
        }
        std::fflush(stdout);
        std::_Exit(3);  // the stalled kernel cannot be waited for or torn down cleanly
      }
    }
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::printf("planned_gemm_stress: %s, padding MMAs %s: %d of %d launches finished (%.1f s)\n", cluster_name, variant,
                o.iterations, o.iterations, wall);
    if (probe) {
      // every role of the last launch reached the end
      const auto last = probe->snapshot();
      const std::size_t finished = cuda::roles_done(last);
      std::printf("planned_gemm_stress: probe: %zu of %zu roles of the last launch done\n", finished, last.size());
      if (finished != last.size()) return 1;
    }
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "planned_gemm_stress: %s\n", e.what());
    return 1;
  }
  return 0;
}
