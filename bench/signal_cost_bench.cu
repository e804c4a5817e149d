// What the tile-signal producer costs: GEMM1 of one rank's local experts (the planned GEMM, all
// SMs) on the same tiles three ways: without flags in the sequential order (the plain grouped
// GEMM), with one release add per tile into its row band's flag in the sequential order, and
// with the band flags in the remote-first order (launch_order_remote_first over a source split
// of every expert's rows into `ranks` equal blocks, this rank being 0), and in the order that
// tile_signal runs: band blocks (default_band_block for all SMs), then remote-first.
// Shapes as tile_signal_bench: Mixtral-8x7B and DeepSeek-V3 at 4096 and 16384 tokens per rank,
// balanced routing (tokens x top_k rows spread evenly over the local experts), 4 and 8 ranks.
// The variants are timed interleaved in rounds, so that clock drift does not read as a cost;
// per variant the median over all rounds' runs. Random bf16 data; the outputs of the three are
// compared bit for bit (the order and the flags must not change a value).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/cuda/device_array.hpp"
#include "kernels/moe_kernels.hpp"
#include "kernels/gemm/planned/planned_gemm.hpp"
#include "strategies/tile_signal/defaults.hpp"
#include "table_schedule.hpp"
#include "tilemoe/median.hpp"

using namespace tilemoe;

namespace {

struct Shape {
  const char* name;
  int hidden, ffn, experts, top_k;
};

constexpr int kClusterSize = 2;  // both planned clusters take entries in pairs

struct Variant {
  const char* name;
  cuda::TileFlags flags;
  bool remote_first;
  bool blocks;
};

constexpr int kVariants = 4;

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    if (!std::strcmp(argv[i], "--quick")) quick = true;
  }
  FILE* json = json_path.empty() ? nullptr : std::fopen(json_path.c_str(), "w");
  int failures = 0;
  try {
    cudaStream_t s;
    TILEMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const std::vector<Shape> shapes = {{"mixtral-8x7b", 4096, 14336, 8, 2}, {"deepseek-v3", 7168, 2048, 256, 8}};
    const std::vector<int> token_counts = quick ? std::vector<int>{4096} : std::vector<int>{4096, 16384};
    const Variant variants[kVariants] = {{"no flags", cuda::TileFlags::None, false, false},
                                         {"band flags", cuda::TileFlags::PerBand, false, false},
                                         {"band flags, remote-first", cuda::TileFlags::PerBand, true, false},
                                         {"band flags, blocks, remote-first", cuda::TileFlags::PerBand, true, true}};
    int sms = 0;
    TILEMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int rounds = quick ? 3 : 6, runs = 7;
    std::printf("%-13s %6s %5s %7s %-6s %5s | %10s %10s %10s %10s | %8s %8s %8s %s\n", "shape", "tokens", "ranks", "experts",
                "cl", "block", "plain ms", "flags ms", "+order ms", "+blocks ms", "flags", "+order", "+blocks", "bitwise");
    for (const Shape& shape : shapes) {
      for (int tokens : token_counts) {
        for (int ranks : {4, 8}) {
          const int groups = shape.experts / ranks;
          const int rows = tokens * shape.top_k;
          std::vector<int> row_offset(static_cast<std::size_t>(groups + 1));
          for (int g = 0; g <= groups; ++g) row_offset[static_cast<std::size_t>(g)] = static_cast<int>(std::int64_t(rows) * g / groups);
          // each expert's rows by source rank, in equal blocks: rank 0's own first
          std::vector<int> block(static_cast<std::size_t>(groups * ranks + 1));
          for (int g = 0; g < groups; ++g) {
            const int lo = row_offset[static_cast<std::size_t>(g)], n = row_offset[static_cast<std::size_t>(g + 1)] - lo;
            for (int q = 0; q < ranks; ++q) block[static_cast<std::size_t>(g * ranks + q)] = lo + n * q / ranks;
          }
          block.back() = rows;
          // the cluster the layers run the planned GEMM on (ExpertFfn: always 1x2)
          const cuda::PlannedCluster cluster = cuda::PlannedCluster::N2;
          const std::size_t a_count = std::size_t(rows) * shape.ffn, b_count = std::size_t(groups) * shape.hidden * shape.ffn,
                            d_count = std::size_t(rows) * shape.hidden;
          cuda::DeviceArray<__nv_bfloat16> A(a_count), B(b_count), D(d_count);
          cuda::launch_random_bf16(s, A.data(), a_count, 17 + tokens, 1.0f);
          cuda::launch_random_bf16(s, B.data(), b_count, 29 + tokens, 0.02f);
          cuda::DeviceArray<int> d_offset(row_offset.size()), d_block(block.size()), d_count_of(kVariants);
          const int band_block = default_band_block(sms, (shape.hidden + cuda::kPlannedTileN - 1) / cuda::kPlannedTileN);
          TILEMOE_CUDA_CHECK(cudaMemcpyAsync(d_offset.data(), row_offset.data(), row_offset.size() * 4, cudaMemcpyHostToDevice, s));
          TILEMOE_CUDA_CHECK(cudaMemcpyAsync(d_block.data(), block.data(), block.size() * 4, cudaMemcpyHostToDevice, s));
          const auto capacity = static_cast<int>(cuda::max_tile_entries(rows, groups, shape.hidden, cluster));
          std::vector<cuda::DeviceArray<cuda::GemmTileEntry>> tables;
          cuda::DeviceArray<cuda::GemmTileEntry> scratch(static_cast<std::size_t>(capacity));
          for (int v = 0; v < kVariants; ++v) {
            tables.emplace_back(static_cast<std::size_t>(capacity));
            cuda::launch_build_tile_table(s, d_offset.data(), groups, shape.hidden, cluster, variants[v].flags, tables.back().data(),
                                          capacity, d_count_of.data() + v, variants[v].blocks ? band_block : 0);
            if (variants[v].remote_first) {
              cuda::launch_order_remote_first(s, tables.back().data(), d_count_of.data() + v, kClusterSize,
                                              d_block.data(), groups, ranks, 0, scratch.data());
            }
          }
          const auto bands = static_cast<std::size_t>(cuda::max_bands(rows, groups));
          cuda::DeviceArray<unsigned> flags(bands);
          cuda::PlannedGemm gemm(cluster, cuda::PlannedEpilogue::Store, groups, 0);
          auto run_of = [&](int v) {
            cuda::PlannedGemmRun r;
            r.table = tables[static_cast<std::size_t>(v)].data();
            r.count = d_count_of.data() + v;
            r.A = A.data();
            r.a_rows = rows;
            r.B = B.data();
            r.groups = groups;
            r.D = D.data();
            r.N = shape.hidden;
            r.K = shape.ffn;
            r.flags = variants[v].flags == cuda::TileFlags::None ? nullptr : flags.data();
            return r;
          };
          // bitwise: each variant's output from a poisoned buffer
          std::vector<std::vector<std::uint16_t>> outputs(kVariants, std::vector<std::uint16_t>(d_count));
          for (int v = 0; v < kVariants; ++v) {
            TILEMOE_CUDA_CHECK(cudaMemsetAsync(D.data(), 0xff, d_count * 2, s));
            TILEMOE_CUDA_CHECK(cudaMemsetAsync(flags.data(), 0, bands * 4, s));
            gemm.run(s, run_of(v));
            TILEMOE_CUDA_CHECK(cudaMemcpyAsync(outputs[static_cast<std::size_t>(v)].data(), D.data(), d_count * 2,
                                               cudaMemcpyDeviceToHost, s));
            TILEMOE_CUDA_CHECK(cudaStreamSynchronize(s));
          }
          bool finite = true;
          for (std::size_t i = 0; i < d_count && finite; i += 97) finite = (outputs[0][i] & 0x7f80) != 0x7f80;
          bool bitwise = finite;
          for (int v = 1; v < kVariants; ++v) bitwise = bitwise && outputs[0] == outputs[static_cast<std::size_t>(v)];
          if (!bitwise) ++failures;
          // timing, interleaved; flags grow across runs (the reader is absent: only the adds cost)
          cudaEvent_t a, b;
          TILEMOE_CUDA_CHECK(cudaEventCreate(&a));
          TILEMOE_CUDA_CHECK(cudaEventCreate(&b));
          std::vector<double> ms[kVariants];
          for (int round = 0; round < rounds; ++round) {
            for (int v = 0; v < kVariants; ++v) {
              const cuda::PlannedGemmRun r = run_of(v);
              for (int i = 0; i < runs + 1; ++i) {
                TILEMOE_CUDA_CHECK(cudaEventRecord(a, s));
                gemm.run(s, r);
                TILEMOE_CUDA_CHECK(cudaEventRecord(b, s));
                TILEMOE_CUDA_CHECK(cudaEventSynchronize(b));
                float t = 0;
                TILEMOE_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
                if (i > 0) ms[v].push_back(t);  // the first after a switch warms the variant's table
              }
            }
          }
          cudaEventDestroy(a);
          cudaEventDestroy(b);
          const double plain = median(ms[0]), flagged = median(ms[1]), ordered = median(ms[2]), blocked = median(ms[3]);
          std::printf("%-13s %6d %5d %7d %-6s %5d | %10.3f %10.3f %10.3f %10.3f | %+7.1f%% %+7.1f%% %+7.1f%% %s\n", shape.name,
                      tokens, ranks, groups, cuda::planned_cluster_name(cluster), band_block, plain, flagged, ordered, blocked,
                      100.0 * (flagged / plain - 1), 100.0 * (ordered / plain - 1), 100.0 * (blocked / plain - 1),
                      bitwise ? "yes" : "NO");
          if (json) {
            std::fprintf(json,
                         "{\"shape\":\"%s\",\"tokens\":%d,\"ranks\":%d,\"local_experts\":%d,\"rows\":%d,\"cluster\":\"%s\","
                         "\"plain_ms\":%.4f,\"band_flags_ms\":%.4f,\"band_flags_remote_first_ms\":%.4f,"
                         "\"band_block\":%d,\"band_flags_blocks_remote_first_ms\":%.4f,\"samples\":%zu,\"bitwise\":%s}\n",
                         shape.name, tokens, ranks, groups, rows, cuda::planned_cluster_name(cluster), plain, flagged, ordered,
                         band_block, blocked, ms[0].size(), bitwise ? "true" : "false");
            std::fflush(json);
          }
        }
      }
    }
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    ++failures;
  }
  if (json) std::fclose(json);
  std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "passed", failures);
  return failures ? 1 : 0;
}
