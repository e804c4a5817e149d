// The tile-signal combine overlap against the sequential expert-parallel layer, on virtual
// ranks that each own an SM partition (as if each had a GPU of its own) with the link
// emulation scaled to the partition: the per-rank link is NVLink's effective 370 GB/s times
// the partition's share of the H200's 132 SMs, so that the compute/communication balance of a
// real 8- or 4-GPU node is approached on one GPU. Shapes Mixtral-8x7B and DeepSeek-V3, 4096
// and 16384 tokens per rank; the sweep c (consumer CTAs) x mgb (bands per segment), auto's
// pick marked. Per configuration: median over runs of the slowest rank's forward time (CUDA
// events), the speedup over sequential (on the sequential row: of a token once per destination
// rank over a row per expert), the share of remote rows shipped while GEMM1 ran
// (from a traced run), and a bitwise check of tile_signal against sequential.
// `--transport nccl`: the same with real ranks, one process per GPU (start it with tilemoe
// launch -n N, mpirun -np N or srun; rank 0 prints and writes the JSON), each rank on its whole
// GPU and the real links, no emulation. The cases are the expert-parallel perf cases of the
// registry (tests/cases); `--case NAME:TOKENS[:RANKS]` (repeatable) runs only those, `--list`
// names them. A case too large for this GPU's memory (DeepSeek-V3 at 16384 tokens x 8 virtual ranks
// needs more than an 80 GB card) is reported as skipped, not failed.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moe_cases.hpp"
#include "tilemoe/cuda/cuda_check.hpp"
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
#include "tilemoe/trace.hpp"

using namespace tilemoe;

namespace {

struct Shape {
  const char* name;
  int hidden, ffn, experts, top_k;
};

constexpr int kWholeExpert = 1 << 30;  // a band block no expert reaches: the sequential tile order

struct Variant {
  Strategy strategy;
  int consumer_ctas;  // 0 = auto
  int mgb;
  int band_block = 0;  // 0 = the layer's rule
  bool warmup = false;  // run, not reported: the first world of a shape runs slower (measured 3%)
  std::optional<DispatchVolume> volume;  // unset: the layer's default (a token once per destination rank)
  std::int64_t split_cols = 0;           // comet's GEMM1 columns per split (0: the strategy's)
  int dispatch_ctas = 0, send_ctas = 0;  // comet's exchange CTAs beside GEMM0 and GEMM1 (0: the cost model's)
};

struct Result {
  double ms = 0;
  double hidden = 0;
  bool bitwise = true;
  std::string how;
};

// Where the overlap's time goes, from a traced step, the worst rank each: GEMM1's span, the
// spread of its lanes' first tile starts (a second wave of clusters shows as a late lane),
// the first segment's readiness after GEMM1's start, and the consumer's tail past GEMM1's end.
struct OverlapTimes {
  double gemm1_us = 0, late_lane_us = 0, first_ready_us = 0, tail_us = 0;
};

OverlapTimes overlap_times(const std::vector<DeviceSpan>& spans, int ranks) {
  OverlapTimes worst;
  for (int r = 0; r < ranks; ++r) {
    std::uint64_t g0 = UINT64_MAX, g1 = 0, c0 = UINT64_MAX, c1 = 0;
    std::vector<std::uint64_t> lane_start;
    for (const DeviceSpan& s : spans) {
      if (s.rank != r) continue;
      if (s.track == "GEMM1 tiles") {
        g0 = std::min(g0, s.start_ns);
        g1 = std::max(g1, s.end_ns);
        if (lane_start.size() <= static_cast<std::size_t>(s.lane)) lane_start.resize(static_cast<std::size_t>(s.lane) + 1, UINT64_MAX);
        lane_start[static_cast<std::size_t>(s.lane)] = std::min(lane_start[static_cast<std::size_t>(s.lane)], s.start_ns);
      } else if (s.track == "consumer") {
        c0 = std::min(c0, s.start_ns);
        c1 = std::max(c1, s.end_ns);
      }
    }
    if (g1 == 0) continue;
    std::uint64_t latest = g0;
    for (std::uint64_t t : lane_start) {
      if (t != UINT64_MAX) latest = std::max(latest, t);
    }
    worst.gemm1_us = std::max(worst.gemm1_us, (g1 - g0) / 1e3);
    worst.late_lane_us = std::max(worst.late_lane_us, (latest - g0) / 1e3);
    if (c1 > 0) {
      worst.first_ready_us = std::max(worst.first_ready_us, (static_cast<double>(c0) - static_cast<double>(g0)) / 1e3);
      worst.tail_us = std::max(worst.tail_us, (static_cast<double>(c1) - static_cast<double>(g1)) / 1e3);
    }
  }
  return worst;
}

struct RankRun {
  bool overlapped = false;  // what the layer runs (auto's pick)
  int consumer_ctas = 0;
  std::vector<double> ms;
  std::vector<std::uint16_t> output;
  std::vector<DeviceSpan> spans;
  std::string how;
};

void run_rank(cuda::RankTransport& transport, const MoeConfig& config, const cuda::EpMoeLayerOptions& options, int runs,
              std::uint64_t seed, RankRun& out) {
  transport.bind_thread();
  bench::RankData data(config.tokens, config.hidden, config.num_experts, seed, transport.rank(),
                       transport.stream(cuda::RankStream::Main));
  const std::size_t x_count = data.x_count;
  cudaStream_t stream = data.stream;
  __nv_bfloat16* x = data.x.data();
  __nv_bfloat16* y = data.y.data();
  float* logits = data.logits.data();
  cudaEvent_t start, end;
  TILEMOE_CUDA_CHECK(cudaEventCreate(&start));
  TILEMOE_CUDA_CHECK(cudaEventCreate(&end));
  {
    cuda::EpMoeLayer layer(config, cuda::RandomDeviceWeights{seed}, transport, options);
    out.how = layer.description();
    out.overlapped = layer.strategy() == Strategy::TileSignal;
    out.consumer_ctas = layer.consumer_ctas();
    for (int run = 0; run < runs + 2; ++run) {  // 2 warm-ups
      transport.host_barrier();
      TILEMOE_CUDA_CHECK(cudaMemsetAsync(y, 0xff, x_count * 2, stream));
      TILEMOE_CUDA_CHECK(cudaEventRecord(start, stream));
      layer.forward(stream, x, logits, y, config.tokens);
      TILEMOE_CUDA_CHECK(cudaEventRecord(end, stream));
      layer.check(stream);
      float ms = 0;
      TILEMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, end));
      if (run >= 2) out.ms.push_back(ms);
    }
    out.output.resize(x_count);
    TILEMOE_CUDA_CHECK(cudaMemcpyAsync(out.output.data(), y, x_count * 2, cudaMemcpyDeviceToHost, stream));
    TILEMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (options.record_trace) out.spans = layer.last_trace(stream);
    transport.host_barrier();
  }
  cudaEventDestroy(start);
  cudaEventDestroy(end);
}

// One variant's world-wide outcome: per run the slowest rank's forward, whether every rank's
// output equals its own sequential output, and the overlap figures (the mean share hidden over
// the ranks, the worst rank's times: device clocks are compared within a rank only).
struct Outcome {
  std::vector<double> step_ms;
  bool bitwise = true;
  double hidden = 0;
  OverlapTimes times;
  bool overlapped = false;
  int consumer_ctas = 0;
  std::string how;
  std::vector<DeviceSpan> spans;  // for the trace file: this process's ranks
};

// A rank's part of the outcome, as doubles to gather across processes.
std::vector<std::byte> pack_rank(const RankRun& run, bool bitwise, int world) {
  const OverlapTimes t = overlap_times(run.spans, world);
  std::vector<double> v = {bitwise ? 1.0 : 0.0, hidden_share(run.spans, "GEMM1 tiles", "consumer"),
                           t.gemm1_us, t.late_lane_us, t.first_ready_us, t.tail_us,
                           run.overlapped ? 1.0 : 0.0, static_cast<double>(run.consumer_ctas)};
  v.insert(v.end(), run.ms.begin(), run.ms.end());
  std::vector<std::byte> bytes(v.size() * sizeof(double));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

Outcome combine_ranks(const std::vector<std::vector<std::byte>>& gathered, int runs) {
  Outcome o;
  o.step_ms.assign(static_cast<std::size_t>(runs), 0.0);
  for (std::size_t r = 0; r < gathered.size(); ++r) {
    std::vector<double> v(gathered[r].size() / sizeof(double));
    std::memcpy(v.data(), gathered[r].data(), v.size() * sizeof(double));
    if (v.size() != 8 + static_cast<std::size_t>(runs)) throw_internal("tile_signal_bench: a rank's results are malformed");
    o.bitwise = o.bitwise && v[0] != 0.0;
    o.hidden += v[1] / static_cast<double>(gathered.size());
    o.times.gemm1_us = std::max(o.times.gemm1_us, v[2]);
    o.times.late_lane_us = std::max(o.times.late_lane_us, v[3]);
    o.times.first_ready_us = std::max(o.times.first_ready_us, v[4]);
    o.times.tail_us = std::max(o.times.tail_us, v[5]);
    if (r == 0) {
      o.overlapped = v[6] != 0.0;
      o.consumer_ctas = static_cast<int>(v[7]);
    }
    for (int i = 0; i < runs; ++i) o.step_ms[static_cast<std::size_t>(i)] = std::max(o.step_ms[static_cast<std::size_t>(i)], v[8 + static_cast<std::size_t>(i)]);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  cuda::prepare_cuda_environment();
  std::string json_path, trace_path;
  bool quick = false;
  bool nccl = false;  // --transport nccl: one process per GPU
  bool list = false;
  std::vector<std::string> case_ids;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    // --trace PREFIX: per shape, tokens and ranks the first overlapped variant's last step, to
    // PREFIX-<shape>-<tokens>x<ranks>.json, and the first comet variant's to ...-comet.json
    if (!std::strcmp(argv[i], "--trace") && i + 1 < argc) trace_path = argv[++i];
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    if (!std::strcmp(argv[i], "--transport") && i + 1 < argc) nccl = std::strcmp(argv[++i], "nccl") == 0;
    // --case NAME:TOKENS[:RANKS] (repeatable): only these cases of the sweep; --list: their ids
    if (!std::strcmp(argv[i], "--case") && i + 1 < argc) case_ids.emplace_back(argv[++i]);
    if (!std::strcmp(argv[i], "--list")) list = true;
  }
  // The expert-parallel perf cases of the registry (tests/cases), or those --case names:
  // NAME:TOKENS:RANKS is one case, NAME:TOKENS every world size of it.
  std::vector<cases::MoeCase> chosen;
  for (const cases::MoeCase& c : cases::select_cases(true, cases::kPerf)) {
    if (case_ids.empty() && (!quick || c.quick)) chosen.push_back(c);
  }
  for (const std::string& id : case_ids) {
    const std::size_t before = chosen.size();
    for (const cases::MoeCase& c : cases::registry()) {
      if (c.expert_parallel() && (c.id() == id || c.id().rfind(id + ":", 0) == 0)) chosen.push_back(c);
    }
    if (chosen.size() == before) {
      try {
        cases::select_cases(true, cases::kPerf, {id});  // its message names the ids there are
      } catch (const Error& e) {
        std::fprintf(stderr, "--case: %s\n", e.what());
      }
      return 2;
    }
  }
  if (list) {
    for (const cases::MoeCase& c : chosen) std::printf("%s\n", c.id().c_str());
    return 0;
  }
  // real ranks: this process is one of them; the launcher says which
  bench::BenchRanks world_ranks(nccl, json_path);
  const launch::LaunchEnv& env = world_ranks.env;
  launch::Rendezvous* rendezvous = world_ranks.rendezvous.get();
  const bool reporter = world_ranks.reporter;
  FILE* json = world_ranks.json;
  int failures = 0;
  try {
    const int device = nccl ? env.local_rank : 0;
    TILEMOE_CUDA_CHECK(cudaSetDevice(device));  // real ranks: each on its own GPU
    int sms = 0;
    TILEMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    // real ranks: the chosen shapes and token counts once each, on the launcher's world
    if (nccl) {
      std::vector<cases::MoeCase> worlds;
      for (cases::MoeCase c : chosen) {
        c.ranks = env.world_size;
        const bool seen = std::any_of(worlds.begin(), worlds.end(), [&](const cases::MoeCase& w) { return w.id() == c.id(); });
        if (!seen && c.experts % c.ranks == 0) worlds.push_back(c);
      }
      chosen = worlds;
    }
    // sequential with a row per expert (the dispatch's volume before: the speedup of the next row
    // is the dispatch once per rank's), sequential (traced, for GEMM1's own span), auto (the
    // cost model picks the strategy and the split), tile_signal with the model's split, then the sweep
    std::vector<Variant> variants = {{Strategy::Sequential, 0, 1, 0, true},
                                     {Strategy::Sequential, 0, 1, 0, false, DispatchVolume::RowPerExpert},
                                     {Strategy::Sequential, 0, 1},
                                     {Strategy::Auto, 0, 1},
                                     {Strategy::TileSignal, 0, 1},
                                     {Strategy::TileSignal, 0, 1, kWholeExpert},
                                     {Strategy::Comet, 0, 1},
                                     {Strategy::Comet, 0, 1, 0, false, std::nullopt, 1024},
                                     // the model's exchange CTAs against their neighbours
                                     {Strategy::Comet, 0, 1, 0, false, std::nullopt, 0, 1, 1},
                                     {Strategy::Comet, 0, 1, 0, false, std::nullopt, 0, 3, 2}};
    const std::vector<int> sweep_c = quick ? std::vector<int>{2, 4, 8} : std::vector<int>{2, 4, 8, 14, 20, 28};
    for (int c : sweep_c) {
      for (int mgb : {1, 2}) variants.push_back({Strategy::TileSignal, c, mgb});
    }
    const int runs = quick ? 5 : 10;
    std::printf("%-13s %6s %5s %-30s %9s %8s %7s %7s | %8s %7s %7s %7s\n", "shape", "tokens", "ranks", "variant", "layer ms",
                "speedup", "hidden", "bitwise", "GEMM1 us", "late", "ready", "tail");
    for (const cases::MoeCase& c : chosen) {
      const Shape shape{c.name.c_str(), static_cast<int>(c.hidden), static_cast<int>(c.ffn), static_cast<int>(c.experts),
                        static_cast<int>(c.top_k)};
      const int tokens = static_cast<int>(c.tokens);
      {
        const int n = c.ranks;
        {
          MoeConfig config;
          config.tokens = tokens;
          config.hidden = shape.hidden;
          config.ffn_hidden = shape.ffn;
          config.num_experts = shape.experts;
          config.top_k = shape.top_k;
          // virtual ranks: each on its partition (the driver's granularity is 8 SMs), its
          // stores to other ranks paced to NVLink's effective 370 GB/s times its share of the
          // SMs; real ranks: a whole GPU each, the real links
          const int sms_per_rank = nccl ? sms : (sms / n) / 8 * 8;
          cuda::VirtualWorldOptions world_options;
          world_options.sms_per_rank = sms_per_rank;
          world_options.link_gbps = 370.0 * sms_per_rank / 132.0;
          world_options.timeout = std::chrono::milliseconds(30000);
          const std::string where_run =
              nccl ? "whole GPU per rank, real links" : std::to_string(sms_per_rank) + " SMs/rank, link " +
                                                            std::to_string(static_cast<int>(world_options.link_gbps + 0.5)) + " GB/s";
          // balanced routing sends about tokens x top_k rows to each rank: room for 1.5x that
          const std::int64_t receive_rows = static_cast<std::int64_t>(1.5 * tokens * shape.top_k);
          bool traced = false, traced_comet = false;  // the first overlapped (tile_signal) and comet variants
          std::vector<std::vector<std::uint16_t>> sequential_output(static_cast<std::size_t>(n));  // per rank of this process
          double sequential_ms = 0, row_per_expert_ms = 0;
          std::string out_of_memory;  // set once a variant of this case did not fit: the others are skipped
          for (const Variant& v : variants) {
            // a rank keeps at least one GEMM1 cluster (2 SMs): larger c of the sweep (made for
            // a whole 132-SM GPU) do not apply to a partition
            if (v.consumer_ctas > sms_per_rank - 2) continue;
            cuda::EpMoeLayerOptions options;
            options.strategy = v.strategy;
            options.tile_signal.consumer_ctas = v.consumer_ctas;
            options.tile_signal.bands_per_segment = v.mgb;
            options.tile_signal.band_block = v.band_block;
            options.receive_rows = receive_rows;
            options.dispatch_volume = v.volume;
            options.comet.split_cols = v.split_cols;
            options.comet.dispatch_ctas = v.dispatch_ctas;
            options.comet.send_ctas = v.send_ctas;
            options.record_trace = true;  // every variant's last step: GEMM1's span next to the consumer's
            const std::size_t region = cuda::EpMoeLayer::region_bytes(config, n, options);
            // each rank's output against its own sequential output (kept by the rank's process)
            auto judge = [&](int r, const RankRun& run) {
              auto& seq = sequential_output[static_cast<std::size_t>(r)];
              if (seq.empty()) {  // the first sequential run (the warm-up) is the reference
                seq = run.output;
                return true;
              }
              return run.output == seq;
            };
            Outcome res;
            if (nccl) {
              // this process's rank; a failure ends the process, and the peers' bounded waits name it
              cuda::NcclWorld world(*rendezvous, region, device, {std::chrono::milliseconds(60000)});
              RankRun mine;
              run_rank(world.transport(), config, options, runs, 1234, mine);
              const bool same = judge(env.rank, mine);
              res = combine_ranks(rendezvous->all_gather(pack_rank(mine, same, n)), runs);
              res.how = mine.how;
              res.spans = std::move(mine.spans);
            } else {
              std::vector<RankRun> ranks(static_cast<std::size_t>(n));
              std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
              try {
                cuda::VirtualWorld world(n, region, 0, world_options);
                errors = world.run_ranks([&](cuda::RankTransport& transport) {
                  run_rank(transport, config, options, runs, 1234, ranks[static_cast<std::size_t>(transport.rank())]);
                });
              } catch (const Error& e) {
                if (e.kind() != ErrorKind::OutOfMemory) throw;
                out_of_memory = std::string("the world's symmetric regions: ") + e.what();
              }
              // a rank that ran out of memory makes its peers fail too (they leave the world it
              // abandoned): the case is too large for this GPU, which is not a failure of the layer
              for (int r = 0; r < n && out_of_memory.empty(); ++r) {
                if (!errors[static_cast<std::size_t>(r)]) continue;
                const ErrorReport report = report_of(errors[static_cast<std::size_t>(r)]);
                if (report.kind == ErrorKind::OutOfMemory) out_of_memory = "rank " + std::to_string(r) + ": " + report.message;
              }
              if (!out_of_memory.empty()) {
                std::printf("SKIP %s %d x %d: does not fit in this GPU's memory, the case's remaining variants skipped too (%s)\n",
                            shape.name, n, tokens, out_of_memory.c_str());
                std::fflush(stdout);
                if (json) {
                  std::fprintf(json, "{\"shape\":\"%s\",\"tokens\":%d,\"ranks\":%d,\"skipped\":\"out of device memory\"}\n",
                               shape.name, tokens, n);
                  std::fflush(json);
                }
                break;
              }
              bool failed = false;
              for (int r = 0; r < n; ++r) {
                if (!errors[static_cast<std::size_t>(r)]) continue;
                std::printf("FAIL %s %d x %d rank %d: %s\n", shape.name, n, tokens, r,
                            report_of(errors[static_cast<std::size_t>(r)]).message.c_str());
                failed = true;
              }
              if (failed) {
                ++failures;
                continue;
              }
              std::vector<std::vector<std::byte>> packed;
              std::vector<DeviceSpan> spans;
              for (int r = 0; r < n; ++r) {
                const RankRun& run = ranks[static_cast<std::size_t>(r)];
                packed.push_back(pack_rank(run, judge(r, run), n));
                spans.insert(spans.end(), run.spans.begin(), run.spans.end());
              }
              res = combine_ranks(packed, runs);
              res.how = ranks[0].how;
              // one GPU, one clock: the share hidden over all ranks' spans together (as the
              // earlier tables of BENCHMARKS.md count it)
              res.hidden = hidden_share(spans, "GEMM1 tiles", "consumer");
              res.spans = std::move(spans);
            }
            if (v.warmup) continue;
            const double layer_ms = median(res.step_ms);
            const bool overlapped = res.overlapped;  // auto may have picked sequential
            const bool row_per_expert = v.volume == DispatchVolume::RowPerExpert;
            double baseline_ms = sequential_ms;  // what the speedup column divides
            if (v.strategy == Strategy::Sequential) {
              if (!res.bitwise) ++failures;
              (row_per_expert ? row_per_expert_ms : sequential_ms) = layer_ms;
              baseline_ms = row_per_expert_ms > 0 ? row_per_expert_ms : layer_ms;
            } else {
              if (!res.bitwise) ++failures;
              const bool comet = v.strategy == Strategy::Comet;
              if ((comet ? !traced_comet : overlapped && !traced) && !trace_path.empty()) {
                const std::string where =
                    std::string(shape.name) + "-" + std::to_string(tokens) + "x" + std::to_string(n) + (comet ? "-comet" : "");
                if (reporter) write_device_trace(trace_path + "-" + where + ".json", where + " " + res.how, res.spans);
                (comet ? traced_comet : traced) = true;
              }
            }
            if (!overlapped) res.hidden = 0;
            const std::string variant =
                v.strategy == Strategy::Sequential ? std::string(row_per_expert ? "sequential row/expert" : "sequential")
                : v.strategy == Strategy::Auto
                    ? std::string("auto -> ") + (overlapped ? "c=" + std::to_string(res.consumer_ctas) : "sequential")
                : v.strategy == Strategy::Comet
                    ? std::string("comet") + (v.split_cols > 0 ? " split=" + std::to_string(v.split_cols) : "") +
                          (v.dispatch_ctas > 0 ? " d=" + std::to_string(v.dispatch_ctas) + " s=" + std::to_string(v.send_ctas) : "")
                    : (v.consumer_ctas == 0 ? "tile_signal model-c" : "tile_signal c=" + std::to_string(v.consumer_ctas)) +
                          " mgb=" + std::to_string(v.mgb) + (v.band_block == kWholeExpert ? " unblocked" : "");
            const OverlapTimes& times = res.times;
            std::printf("%-13s %6d %5d %-30s %9.3f %7.2fx %6.0f%% %7s | %8.0f %7.0f %7.0f %7.0f   (%s; %s)\n", shape.name, tokens,
                        n, variant.c_str(), layer_ms, baseline_ms / layer_ms, 100.0 * res.hidden, res.bitwise ? "yes" : "NO",
                        times.gemm1_us,
                        times.late_lane_us, overlapped ? times.first_ready_us : 0.0, overlapped ? times.tail_us : 0.0,
                        res.how.c_str(), where_run.c_str());
            std::fflush(stdout);
            if (json) {
              std::fprintf(json,
                           "{\"shape\":\"%s\",\"tokens\":%d,\"ranks\":%d,\"variant\":\"%s\",\"auto\":%s,\"consumer_ctas\":%d,"
                           "\"mgb\":%d,\"layer_ms\":%.4f,\"sequential_ms\":%.4f,\"hidden_share\":%.4f,\"bitwise\":%s,"
                           "\"transport\":\"%s\",\"sms_per_rank\":%d,\"link_gbps\":%.1f,\"how\":\"%s\",\"runs\":%d,"
                           "\"gemm1_us\":%.1f,\"late_lane_us\":%.1f,\"first_ready_us\":%.1f,\"tail_us\":%.1f}\n",
                           shape.name, tokens, n, variant.c_str(), v.strategy == Strategy::Auto ? "true" : "false",
                           overlapped ? res.consumer_ctas : 0, v.mgb, layer_ms, sequential_ms, res.hidden,
                           res.bitwise ? "true" : "false", nccl ? "nccl" : "virtual", sms_per_rank,
                           nccl ? 0.0 : world_options.link_gbps, res.how.c_str(), runs, times.gemm1_us, times.late_lane_us,
                           times.first_ready_us, times.tail_us);
              std::fflush(json);
            }
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
