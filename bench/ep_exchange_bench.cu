// Dispatch and combine of the expert-parallel layer on virtual ranks (N ranks on one GPU): the
// device-API exchange kernels (a token once per destination rank, and a row per expert) against
// the host-API path (counts to the host, then sized
// all-to-alls), at the DeepEP shape, the Mixtral shape and a decode shape. The experts are the
// identity (DeepEP's own benchmark times the exchange alone), so the output must equal the
// input when the top-k weights sum to one: that is checked on every configuration.
//
// Per run every rank meets at a host barrier, then runs one step; a stage's time on a rank is
// between the CUDA events around it. Reported per configuration: medians over the runs of the
// slowest rank's dispatch and combine time, and the algorithm bandwidth per rank (bytes a rank
// sends / time; "remote" counts only rows for other ranks). On one GPU all ranks share its
// memory: the ceiling is the device copy rate measured in the same run, divided among the
// ranks. Informational; the real NVLink figures need several GPUs: `--transport nccl` runs
// the same with one process per GPU (start it with mpirun -np N, srun or tilemoe launch -n N;
// rank 0 prints and writes the JSON).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tilemoe/cuda/cuda_check.hpp"
#include "exec/cuda/gpu_rates.hpp"
#include "tilemoe/launch/launch_env.hpp"
#include "tilemoe/launch/rendezvous.hpp"
#include "bench_ranks.hpp"
#include "rank_data.hpp"
#include "tilemoe/cuda/ep_moe_layer.hpp"
#include "tilemoe/cuda/module_loading.hpp"
#include "tilemoe/cuda/nccl_world.hpp"
#include "tilemoe/cuda/virtual_world.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/median.hpp"

using namespace tilemoe;

namespace {

struct Shape {
  const char* name;
  int tokens, hidden, experts, top_k;
};

struct RankTimes {
  std::vector<double> dispatch_ms, combine_ms;  // per run
  std::int64_t remote_rows = 0, rows = 0;
  double max_rel_error = 0;
};

// A rank's times and counts as bytes, to gather them at rank 0 of a multi-process world.
std::vector<std::byte> pack(const RankTimes& t) {
  std::vector<double> v = {static_cast<double>(t.dispatch_ms.size()), static_cast<double>(t.rows),
                           static_cast<double>(t.remote_rows), t.max_rel_error};
  v.insert(v.end(), t.dispatch_ms.begin(), t.dispatch_ms.end());
  v.insert(v.end(), t.combine_ms.begin(), t.combine_ms.end());
  std::vector<std::byte> bytes(v.size() * sizeof(double));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

RankTimes unpack(const std::vector<std::byte>& bytes) {
  std::vector<double> v(bytes.size() / sizeof(double));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(double));
  RankTimes t;
  const auto runs = static_cast<std::size_t>(v.at(0));
  t.rows = static_cast<std::int64_t>(v.at(1));
  t.remote_rows = static_cast<std::int64_t>(v.at(2));
  t.max_rel_error = v.at(3);
  t.dispatch_ms.assign(v.begin() + 4, v.begin() + 4 + static_cast<std::ptrdiff_t>(runs));
  t.combine_ms.assign(v.begin() + 4 + static_cast<std::ptrdiff_t>(runs), v.begin() + 4 + 2 * static_cast<std::ptrdiff_t>(runs));
  return t;
}

// bf16 bits -> float
float bf16_value(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// How a configuration exchanges: the path, and the dispatch's volume (the host path's
// all-to-all sends a row per expert).
struct Exchange {
  cuda::DispatchPath path;
  DispatchVolume volume;
  const char* name;
};

void run_rank(int r, const Shape& s, const MoeConfig& config, cuda::RankTransport& transport, const Exchange& exchange,
              int runs, std::uint64_t seed, RankTimes& out, std::string& description) {
  transport.bind_thread();
  bench::RankData data(s.tokens, s.hidden, s.experts, seed, r, transport.stream(cuda::RankStream::Main));
  const std::size_t x_count = data.x_count;
  cudaStream_t stream = data.stream;
  __nv_bfloat16* x = data.x.data();
  __nv_bfloat16* y = data.y.data();
  float* logits = data.logits.data();
  cuda::EpStageEvents events;
  for (cudaEvent_t& e : events.boundary) TILEMOE_CUDA_CHECK(cudaEventCreate(&e));
  {
    cuda::EpMoeLayerOptions options;
    options.dispatch = exchange.path;
    options.dispatch_volume = exchange.volume;
    cuda::EpMoeLayerHarness harness;
    harness.identity_experts = true;  // the exchange alone
    cuda::EpMoeLayer layer(config, cuda::RandomDeviceWeights{seed}, transport, options, harness);
    if (r == 0) description = layer.description();
    for (int run = 0; run < runs + 3; ++run) {  // 3 warm-ups
      transport.host_barrier();
      TILEMOE_CUDA_CHECK(cudaMemsetAsync(y, 0xff, x_count * 2, stream));  // NaN poison
      layer.forward(stream, x, logits, y, s.tokens, &events);
      layer.check(stream);
      if (run < 3) continue;
      float dispatch = 0, combine = 0;
      // from the permute on: the permuted copy (a row per expert) or the send lists (once per
      // rank) belong to the dispatch
      TILEMOE_CUDA_CHECK(cudaEventElapsedTime(&dispatch, events.boundary[cuda::kEpPermute], events.boundary[cuda::kEpGemm0]));
      TILEMOE_CUDA_CHECK(cudaEventElapsedTime(&combine, events.boundary[cuda::kEpCombineSend], events.boundary[cuda::kEpCombine]));
      out.dispatch_ms.push_back(dispatch);
      out.combine_ms.push_back(combine);
    }
    // identity experts and renormalised weights: the output is the input
    std::vector<std::uint16_t> hx(x_count), hy(x_count);
    TILEMOE_CUDA_CHECK(cudaMemcpyAsync(hx.data(), x, x_count * 2, cudaMemcpyDeviceToHost, stream));
    TILEMOE_CUDA_CHECK(cudaMemcpyAsync(hy.data(), y, x_count * 2, cudaMemcpyDeviceToHost, stream));
    TILEMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < x_count; ++i) {
      const double a = bf16_value(hx[i]), b = bf16_value(hy[i]);
      err += (a - b) * (a - b);
      norm += a * a;
    }
    out.max_rel_error = std::isfinite(err) ? std::sqrt(err / std::max(norm, 1e-30)) : INFINITY;
    const Routing routing = layer.last_routing(stream, s.tokens);
    const int local = s.experts / transport.world_size();
    for (std::int32_t e : routing.expert) out.remote_rows += e / local != r;
    out.rows = static_cast<std::int64_t>(routing.expert.size());
    transport.host_barrier();  // frees only after every rank's last step
  }
  for (cudaEvent_t e : events.boundary) cudaEventDestroy(e);
}

}  // namespace

int main(int argc, char** argv) {
  cuda::prepare_cuda_environment();
  std::string json_path;
  bool quick = false;
  double link_gbps = 0;  // --link-gbps G: pace each rank's exchange to G GB/s (the device path only)
  int sms_per_rank = 0;  // --sms-per-rank S: each rank on its own partition of S SMs
  bool nccl = false;     // --transport nccl: one process per GPU
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    if (!std::strcmp(argv[i], "--link-gbps") && i + 1 < argc) link_gbps = std::atof(argv[++i]);
    if (!std::strcmp(argv[i], "--sms-per-rank") && i + 1 < argc) sms_per_rank = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--transport") && i + 1 < argc) nccl = std::strcmp(argv[++i], "nccl") == 0;
  }
  // real ranks: this process is one of them; the launcher says which
  bench::BenchRanks world_ranks(nccl, json_path);
  const launch::LaunchEnv& env = world_ranks.env;
  launch::Rendezvous* rendezvous = world_ranks.rendezvous.get();
  FILE* json = world_ranks.json;
  int failures = 0;
  try {
    TILEMOE_CUDA_CHECK(cudaSetDevice(nccl ? env.local_rank : 0));  // real ranks: each on its own GPU
    const double copy_gbps = cuda::device_copy_gbps(nullptr);
    std::printf("measured rate: device copy %.0f GB/s (read + write)%s\n", copy_gbps,
                link_gbps > 0 ? (", links paced to " + std::to_string(link_gbps) + " GB/s per rank").c_str() : "");
    if (json) std::fprintf(json, "{\"kind\":\"rates\",\"copy_gbps\":%.1f}\n", copy_gbps);
    const std::vector<Shape> shapes = {
        {"deepep", 4096, 7168, 256, 8}, {"mixtral", 4096, 4096, 8, 2}, {"decode", 128, 7168, 256, 8}};
    const std::vector<int> world_sizes = nccl ? std::vector<int>{env.world_size}
                                         : quick ? std::vector<int>{4} : std::vector<int>{4, 8};
    const int runs = quick ? 5 : 20;
    std::printf("%-8s %5s %-8s %11s %11s %12s %12s %9s %s\n", "shape", "ranks", "path", "dispatch us", "combine us",
                "disp GB/s/rk", "comb GB/s/rk", "rel err", "(remote share, how)");
    for (const Shape& s : shapes) {
      for (int n : world_sizes) {
        if (s.experts % n != 0) continue;
        MoeConfig config;
        config.tokens = s.tokens;
        config.hidden = s.hidden;
        config.ffn_hidden = 256;  // unused: identity experts
        config.num_experts = s.experts;
        config.top_k = s.top_k;
        config.renormalize = true;
        for (const Exchange& exchange : {Exchange{cuda::DispatchPath::Device, DispatchVolume::OncePerRank, "dev-once"},
                                         Exchange{cuda::DispatchPath::Device, DispatchVolume::RowPerExpert, "dev-row"},
                                         Exchange{cuda::DispatchPath::Host, DispatchVolume::RowPerExpert, "host"}}) {
          if (link_gbps > 0 && exchange.path == cuda::DispatchPath::Host) continue;  // cudaMemcpy is not paced
          cuda::EpMoeLayerOptions region_options;
          region_options.dispatch = exchange.path;
          region_options.dispatch_volume = exchange.volume;
          std::vector<RankTimes> times(static_cast<std::size_t>(n));
          std::vector<std::string> errors(static_cast<std::size_t>(n));
          std::string description;
          const auto seed = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
          if (nccl) {
            // this process's rank; a failure ends the process, and the peers' bounded waits name it
            cuda::NcclWorld world(*rendezvous, cuda::EpMoeLayer::region_bytes(config, n, region_options), env.local_rank,
                                  {std::chrono::milliseconds(60000)});
            RankTimes mine;
            run_rank(env.rank, s, config, world.transport(), exchange, runs, seed, mine, description);
            const auto all = rendezvous->all_gather(pack(mine));
            for (int r = 0; r < n; ++r) times[static_cast<std::size_t>(r)] = unpack(all[static_cast<std::size_t>(r)]);
          } else {
            cuda::VirtualWorldOptions world_options;
            world_options.link_gbps = link_gbps;
            world_options.sms_per_rank = sms_per_rank;
            cuda::VirtualWorld world(n, cuda::EpMoeLayer::region_bytes(config, n, region_options), 0, world_options);
            const std::vector<std::exception_ptr> failed_ranks = world.run_ranks([&](cuda::RankTransport& transport) {
              const int r = transport.rank();
              run_rank(r, s, config, transport, exchange, runs, seed, times[static_cast<std::size_t>(r)], description);
            });
            for (int r = 0; r < n; ++r) {
              const std::exception_ptr& error = failed_ranks[static_cast<std::size_t>(r)];
              if (error) errors[static_cast<std::size_t>(r)] = report_of(error).message;
            }
          }
          bool failed = false;
          for (int r = 0; r < n; ++r) {
            if (!errors[static_cast<std::size_t>(r)].empty()) {
              std::printf("FAIL %s N=%d %s rank %d: %s\n", s.name, n, exchange.name, r,
                          errors[static_cast<std::size_t>(r)].c_str());
              failed = true;
            }
          }
          if (failed) {
            ++failures;
            continue;
          }
          // per run the step's stage time is its slowest rank's
          std::vector<double> dispatch, combine;
          for (int run = 0; run < runs; ++run) {
            double d = 0, c = 0;
            for (const RankTimes& t : times) {
              d = std::max(d, t.dispatch_ms[static_cast<std::size_t>(run)]);
              c = std::max(c, t.combine_ms[static_cast<std::size_t>(run)]);
            }
            dispatch.push_back(d);
            combine.push_back(c);
          }
          std::int64_t rows = 0, remote = 0;
          double err = 0;
          for (const RankTimes& t : times) {
            rows += t.rows;
            remote += t.remote_rows;
            err = std::max(err, t.max_rel_error);
          }
          const double bytes_per_rank = double(rows) / n * s.hidden * 2;
          const double d_ms = median(dispatch), c_ms = median(combine);
          const double d_gbps = bytes_per_rank / (d_ms * 1e-3) / 1e9, c_gbps = bytes_per_rank / (c_ms * 1e-3) / 1e9;
          const bool ok = err < 1e-2;
          if (!ok) ++failures;
          std::printf("%-8s %5d %-8s %11.1f %11.1f %12.1f %12.1f %9.1e (%.0f%%, %s)%s\n", s.name, n, exchange.name,
                      d_ms * 1e3, c_ms * 1e3, d_gbps, c_gbps, err, 100.0 * double(remote) / double(std::max<std::int64_t>(rows, 1)),
                      description.c_str(), ok ? "" : "  FAIL: output differs from the input");
          if (json) {
            std::fprintf(json,
                         "{\"kind\":\"exchange\",\"shape\":\"%s\",\"tokens\":%d,\"hidden\":%d,\"experts\":%d,\"top_k\":%d,"
                         "\"ranks\":%d,\"path\":\"%s\",\"dispatch_us\":%.2f,\"combine_us\":%.2f,\"dispatch_gbps_per_rank\":%.2f,"
                         "\"combine_gbps_per_rank\":%.2f,\"bytes_per_rank\":%.0f,\"remote_share\":%.4f,\"rel_error\":%.3e,"
                         "\"how\":\"%s\",\"runs\":%d,\"link_gbps\":%.1f,\"sms_per_rank\":%d}\n",
                         s.name, s.tokens, s.hidden, s.experts, s.top_k, n, exchange.name, d_ms * 1e3, c_ms * 1e3,
                         d_gbps, c_gbps, bytes_per_rank, double(remote) / double(std::max<std::int64_t>(rows, 1)), err,
                         description.c_str(), runs, link_gbps, sms_per_rank);
            std::fflush(json);
          }
        }
      }
    }
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    ++failures;
  }
  std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "passed", failures);
  return failures ? 1 : 0;
}
