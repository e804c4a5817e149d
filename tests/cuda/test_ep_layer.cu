// GPU test of the expert-parallel layer on virtual ranks (N ranks on one GPU, a host thread
// and a non-blocking stream each, exactly as processes would drive real GPUs): against the
// CPU executor and an fp64 reference on fresh random data, outputs poisoned before every run;
// the device and host dispatch paths bit for bit; run after run and a CUDA-graph replay bit
// for bit; a rank that never sends makes every rank fail with a timeout naming it. A plain
// program (CI has no GPU); scripts/device/run.sh runs it. Exit code 0 only if all passed.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "tilemoe/cuda/cuda_check.hpp"
#include "gpu_checks.hpp"
#include "moe_cases.hpp"
#include "oracle.hpp"
#include "sm90_device.hpp"
#include "tilemoe/cpu_executor.hpp"
#include "layer/ep_layer_inspector.hpp"
#include "plan/plan_tables.hpp"
#include "strategies/comet/gpu_plan_shape.hpp"
#include "strategies/comet/gpu_setup.hpp"
#include "strategies/sequential/gpu_plan_shape.hpp"
#include "strategies/strategies.hpp"
#include "strategies/tile_signal/gpu_plan_shape.hpp"
#include "tilemoe/cuda/ep_moe_layer.hpp"
#include "tilemoe/cuda/module_loading.hpp"
#include "tilemoe/cuda/moe_layer.hpp"
#include "tilemoe/cuda/virtual_world.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/reference.hpp"
#include "tilemoe/routing.hpp"
#include "tilemoe/synthetic.hpp"

using namespace tilemoe;
using namespace std::chrono_literals;

namespace {

using gpu_checks::expect;
using gpu_checks::failures;
std::chrono::milliseconds world_timeout{10000};  // --timeout-s (longer under compute-sanitizer)
bool with_tile_signal = true;                     // --no-tile-signal: the sequential paths only

// One rank's device buffers, allocated before and freed after the world's forwards (cudaFree
// synchronises the whole device, which would wait for the peers' waiting kernels).
struct RankBuffers {
  __nv_bfloat16* input = nullptr;
  float* logits = nullptr;
  __nv_bfloat16* output = nullptr;
  std::size_t out_bytes = 0;
  cudaStream_t stream = nullptr;  // the rank's world stream (RankStream::Main), not owned

  RankBuffers(const Matrix& x, const std::vector<float>& l, std::int64_t tokens, std::int64_t hidden, cudaStream_t rank_stream)
      : stream(rank_stream) {
    out_bytes = static_cast<std::size_t>(tokens * hidden) * 2;
    TILEMOE_CUDA_CHECK(cudaMalloc(&input, std::max<std::size_t>(x.data.size(), 16)));
    TILEMOE_CUDA_CHECK(cudaMalloc(&logits, std::max<std::size_t>(l.size() * 4, 16)));
    TILEMOE_CUDA_CHECK(cudaMalloc(&output, std::max<std::size_t>(out_bytes, 16)));
    if (!x.data.empty()) TILEMOE_CUDA_CHECK(cudaMemcpyAsync(input, x.data.data(), x.data.size(), cudaMemcpyHostToDevice, stream));
    if (!l.empty()) TILEMOE_CUDA_CHECK(cudaMemcpyAsync(logits, l.data(), l.size() * 4, cudaMemcpyHostToDevice, stream));
    TILEMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  ~RankBuffers() {
    cudaFree(input);
    cudaFree(logits);
    cudaFree(output);
  }
  void poison() { TILEMOE_CUDA_CHECK(cudaMemsetAsync(output, 0xff, out_bytes, stream)); }  // NaN
  Matrix read(std::int64_t tokens, std::int64_t hidden) {
    Matrix out(DType::BF16, tokens, hidden);
    if (out_bytes) TILEMOE_CUDA_CHECK(cudaMemcpyAsync(out.data.data(), output, out_bytes, cudaMemcpyDeviceToHost, stream));
    TILEMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    return out;
  }
};

// Runs `body(rank)` on one thread per rank of `vw`; an exception on a rank is a failure named by
// it (and the world's run_ranks lets its peers leave their barriers at once).
void on_every_rank(cuda::VirtualWorld& vw, const std::function<void(int)>& body) {
  const std::vector<std::exception_ptr> errors = vw.run_ranks([&](cuda::RankTransport& transport) {
    TILEMOE_CUDA_CHECK(cudaSetDevice(0));
    body(transport.rank());
  });
  for (int r = 0; r < vw.size(); ++r) {
    const std::exception_ptr& error = errors[static_cast<std::size_t>(r)];
    if (error) expect(false, "rank " + std::to_string(r) + ": " + report_of(error).message);
  }
}

// Steps `runs` eager forwards of `layer` (outputs into `eager`), then one captured in a CUDA
// graph and replayed (into `replayed`): all ranks meet after every read-back (compute-sanitizer
// makes copies wait for the whole device, a peer's next step included).
void eager_and_replayed(cuda::EpMoeLayer& layer, cuda::RankTransport& transport, RankBuffers& b, std::int64_t T,
                        std::int64_t hidden, int runs, std::vector<Matrix*> eager, Matrix& replayed) {
  for (int run = 0; run < runs; ++run) {
    b.poison();
    layer.forward(b.stream, b.input, b.logits, b.output, T);
    layer.check(b.stream);
    *eager[static_cast<std::size_t>(run)] = b.read(T, hidden);
    transport.host_barrier();
  }
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TILEMOE_CUDA_CHECK(cudaStreamBeginCapture(b.stream, cudaStreamCaptureModeThreadLocal));
  try {
    layer.forward(b.stream, b.input, b.logits, b.output, T);
  } catch (...) {
    cudaStreamEndCapture(b.stream, &graph);  // leave the stream usable for the clean-up
    throw;
  }
  TILEMOE_CUDA_CHECK(cudaStreamEndCapture(b.stream, &graph));
  // every rank's graph is instantiated and uploaded before any rank launches one: instantiation
  // and the first launch's upload may synchronise the device, which would wait for a peer's
  // launched graph waiting for this rank (measured: the 8-rank top-8 case's tile_signal replay
  // timed out in two runs of two, the last rank to instantiate never dispatching)
  TILEMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  TILEMOE_CUDA_CHECK(cudaGraphUpload(exec, b.stream));
  b.poison();
  TILEMOE_CUDA_CHECK(cudaStreamSynchronize(b.stream));
  transport.host_barrier();
  TILEMOE_CUDA_CHECK(cudaGraphLaunch(exec, b.stream));
  layer.check(b.stream);
  replayed = b.read(T, hidden);
  transport.host_barrier();  // the destroys may free device memory: only after every rank's replay
  TILEMOE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TILEMOE_CUDA_CHECK(cudaGraphDestroy(graph));
}

// The outputs against the CPU executor and fp64 (on a token sample past the oracle's work bound).
void check_against_oracle(const cases::MoeCase& c, const EpWorld& world, const SyntheticStep& step, const ExpertWeights& weights,
                          const std::vector<Routing>& routing, const std::vector<Matrix>& device_out) {
  const cases::OracleErrors e = cases::oracle_errors(world, step.inputs, routing, weights, device_out, c.tolerance);
  expect(e.within_tolerance(), e.describe());
}

// The plans the GPU compiled from the step's exchanged counts (`path`: the strategy and which
// dispatch path exchanged them, with `volume`), downloaded from every rank: each equals the host
// compiler's (`host_plans`) for the same counts at the same tile shape, they pass validate_plan
// with the routing's per-token tables, and the CPU executor running them gives the GPU's output
// within bf16 tolerance.
void check_device_plans(const cases::MoeCase& c, const EpWorld& world, const SyntheticStep& step, const ExpertWeights& weights,
                        const std::vector<Routing>& routing, std::vector<StepPlan> device_plans,
                        const std::vector<StepPlan>& host_plans, const std::vector<Matrix>& device_out, const char* path,
                        DispatchVolume volume, plan_detail::DispatchOrder order = plan_detail::DispatchOrder::Ascending) {
  const plan_detail::HostStepCounts counts = plan_detail::routing_counts(routing, static_cast<int>(c.experts));
  std::string difference;
  for (std::size_t r = 0; r < device_plans.size() && difference.empty(); ++r) {
    difference = plan_detail::first_table_difference(device_plans[r], host_plans[r]);
    if (!difference.empty()) difference = "rank " + std::to_string(r) + ": " + difference + " (device / host)";
    plan_detail::add_token_tables(device_plans[r], routing, counts, volume, order, false);
  }
  if (!difference.empty()) std::printf("  %s\n", difference.c_str());
  expect(difference.empty(), std::string("every rank's device-built plan (") + path +
                                 ") equals the host compiler's for the same counts");
  bool valid = true;
  try {
    validate_plan(device_plans);
  } catch (const Error& e) {
    valid = false;
    std::printf("  validate_plan: %s\n", e.what());
  }
  expect(valid, std::string("validate_plan accepts the device-built plans (") + path + ")");
  if (!valid) return;
  if (!sample_tokens(world, routing, cases::kOracleWork).whole()) {
    std::printf("  (the CPU executor does not run the device-built plans: the whole step exceeds the oracle's work bound)\n");
    return;
  }
  const cases::OracleErrors e =
      cases::oracle_errors_of_plans(world, step.inputs, routing, weights, device_plans, device_out, c.tolerance);
  expect(e.within_tolerance(), std::string("the CPU executor running the device-built plans (") + path + "): " + e.describe());
}

// comet's options in the cases: splits of one tile (one real tile and a padding mate per band)
// where hidden has more than two, the strategy's default elsewhere; a dispatch of a sender and
// two placers (the sources dealt between them) from three ranks on, the model's CTAs elsewhere.
cuda::EpMoeLayerOptions comet_options_of(const cases::MoeCase& c) {
  cuda::EpMoeLayerOptions options;
  options.strategy = Strategy::Comet;
  options.comet.split_cols = c.hidden > 2 * cuda::kPlannedTileN ? cuda::kPlannedTileN : 0;
  options.comet.dispatch_ctas = c.ranks >= 3 ? 3 : 0;
  return options;
}

// comet in a world of its own: the dispatch beside GEMM0, whose tiles wait for their sources,
// GEMM1 in column splits; two steps and a graph replay with the default dispatch volume, one step
// with a row per expert and the whole exchange on one CTA beside each GEMM, all the sequential
// output bitwise; the device-built plans equal the
// host compiler's at the GPU's tiling and run on the CPU executor.
void comet_case(const cases::MoeCase& c, const EpWorld& world, const SyntheticStep& step, const ExpertWeights& weights,
                const MoeConfig& config, cuda::VirtualWorld& vw, const std::vector<Matrix>& sequential_out, DispatchVolume volume) {
  const int before = failures();
  const auto n = static_cast<std::size_t>(c.ranks);
  std::vector<Matrix> out(n), second(n), replayed(n), rows_out(n);
  std::vector<StepPlan> plans(n);
  std::vector<Routing> routing(n);
  std::string description;
  const cuda::EpMoeLayerOptions options = comet_options_of(c);
  on_every_rank(vw, [&](int r) {
    const auto ri = static_cast<std::size_t>(r);
    const std::int64_t T = world.tokens_per_rank[ri];
    cuda::RankTransport& transport = vw.rank(r);
    transport.bind_thread();
    RankBuffers b(step.inputs[ri], step.logits[ri], T, c.hidden, transport.stream(cuda::RankStream::Main));
    {
      cuda::EpMoeLayer layer(config, weights, transport, options);
      if (r == 0) description = layer.description();
      eager_and_replayed(layer, transport, b, T, c.hidden, 2, {&out[ri], &second[ri]}, replayed[ri]);
      routing[ri] = layer.last_routing(b.stream, T);
      plans[ri] = cuda::EpMoeLayerInspector::last_device_plan(layer, b.stream);
    }
    transport.host_barrier();
    cuda::EpMoeLayerOptions rows = options;
    rows.dispatch_volume = DispatchVolume::RowPerExpert;
    rows.comet.dispatch_ctas = rows.comet.send_ctas = 1;  // one CTA sends, then places; one sends every split
    {
      cuda::EpMoeLayer layer(config, weights, transport, rows);
      b.poison();
      layer.forward(b.stream, b.input, b.logits, b.output, T);
      layer.check(b.stream);
      rows_out[ri] = b.read(T, c.hidden);
    }
    transport.host_barrier();
  });
  if (failures() > before) return;
  std::printf("  %s\n", description.c_str());
  bool same = true, same_rows = true;
  for (std::size_t r = 0; r < n; ++r) {
    same = same && sequential_out[r].bitwise_equal(out[r]) && sequential_out[r].bitwise_equal(second[r]) &&
           sequential_out[r].bitwise_equal(replayed[r]);
    same_rows = same_rows && sequential_out[r].bitwise_equal(rows_out[r]);
  }
  expect(same, "comet gives the sequential output bitwise (two steps and a graph replay)");
  expect(same_rows, "comet with a row per expert gives the sequential output bitwise");
  const std::int64_t split = cuda::comet_gpu_split_cols(c.hidden, options.comet);
  const std::vector<StepPlan> host_plans =
      plan_detail::compile_comet_at(world, routing, PlanOptions{}, plan_detail::gpu_comet_shape(world.layer, 0, 0, volume, split));
  check_device_plans(c, world, step, weights, routing, std::move(plans), host_plans, out, "comet", volume, plan_detail::DispatchOrder::Ring);
}

void run_case(const cases::MoeCase& c, std::uint64_t seed) {
  const int failures_before = failures();
  std::printf("%s: %d virtual ranks, up to %lld tokens each, hidden %lld, ffn %lld, E %lld, top-%lld, %s routing\n",
              c.id().c_str(), c.ranks, (long long)c.tokens, (long long)c.hidden, (long long)c.ffn, (long long)c.experts,
              (long long)c.top_k, std::string(routing_pattern_name(c.pattern)).c_str());
  const EpWorld world = c.world(cases::kTest);
  const SyntheticStep step = synthetic_step(world, c.pattern, seed);
  const ExpertWeights weights = random_weights(world.layer, seed + 1);
  const MoeConfig config = c.config();

  cuda::VirtualWorldOptions world_options;
  world_options.timeout = world_timeout;
  world_options.sms_per_rank = c.sms_per_rank;
  // the largest region of the strategies the case runs
  const std::size_t region = std::max(cuda::EpMoeLayer::region_bytes(config, c.ranks), cuda::EpMoeLayer::region_bytes(config, c.ranks, comet_options_of(c)));
  cuda::VirtualWorld vw(c.ranks, region, 0, world_options);
  if (c.sms_per_rank > 0) std::printf("  SM partitions of %d SMs\n", vw.rank(0).sm_count());
  const auto n = static_cast<std::size_t>(c.ranks);
  std::vector<Matrix> device_out(n), second_out(n), graph_out(n), host_out(n), row_out(n), tile_out(n), tile_second_out(n),
      tile_graph_out(n);
  std::vector<Routing> routing(n);
  std::vector<std::string> description(n), row_description(n);
  std::vector<StepPlan> device_plans(n), host_path_plans(n), row_plans(n), tile_plans(n);
  // the device path's default volume (a world of one sends nothing, so its plans are a row per expert)
  const DispatchVolume volume = c.ranks > 1 ? DispatchVolume::OncePerRank : DispatchVolume::RowPerExpert;
  cuda::TileSignalGpuSchedule tile_schedule;
  cuda::EpMoeLayerHarness build_plan;
  build_plan.build_device_plan = true;
  on_every_rank(vw, [&](int r) {
    const auto ri = static_cast<std::size_t>(r);
    const std::int64_t T = world.tokens_per_rank[ri];
    cuda::RankTransport& transport = vw.rank(r);
    transport.bind_thread();  // before its stream exists: with partitions the stream is the partition's
    RankBuffers b(step.inputs[ri], step.logits[ri], T, c.hidden, transport.stream(cuda::RankStream::Main));
    {
      cuda::EpMoeLayer layer(config, weights, transport, {cuda::GemmPath::Planned, cuda::DispatchPath::Device}, build_plan);
      description[ri] = layer.description();
      eager_and_replayed(layer, transport, b, T, c.hidden, 2, {&device_out[ri], &second_out[ri]}, graph_out[ri]);
      routing[ri] = layer.last_routing(b.stream, T);
      device_plans[ri] = cuda::EpMoeLayerInspector::last_device_plan(layer, b.stream);  // as the graph replay compiled it
      transport.host_barrier();  // nobody builds the next layer while a peer still runs this one
    }
    // one step of a layer with these options: its output, its device-built plan, its description
    auto one_step = [&](const cuda::EpMoeLayerOptions& options, Matrix& out, StepPlan& plan, std::string& how) {
      cuda::EpMoeLayer layer(config, weights, transport, options, build_plan);
      how = layer.description();
      b.poison();
      layer.forward(b.stream, b.input, b.logits, b.output, T);
      layer.check(b.stream);
      out = b.read(T, c.hidden);
      plan = cuda::EpMoeLayerInspector::last_device_plan(layer, b.stream);
      transport.host_barrier();
    };
    std::string host_description;
    one_step({cuda::GemmPath::Planned, cuda::DispatchPath::Host}, host_out[ri], host_path_plans[ri], host_description);
    cuda::EpMoeLayerOptions rows{cuda::GemmPath::Planned, cuda::DispatchPath::Device};  // the host path's volume on the device
    rows.dispatch_volume = DispatchVolume::RowPerExpert;
    one_step(rows, row_out[ri], row_plans[ri], row_description[ri]);
    transport.host_barrier();  // frees (device-wide synchronisations) only after every rank's last step
  });
  if (failures() > failures_before) return;
  std::printf("  %s\n  %s\n", description[0].c_str(), row_description[0].c_str());

  bool same_runs = true, same_graph = true, same_paths = true, same_volumes = true;
  for (std::size_t r = 0; r < n; ++r) {
    same_runs = same_runs && device_out[r].bitwise_equal(second_out[r]);
    same_graph = same_graph && device_out[r].bitwise_equal(graph_out[r]);
    same_paths = same_paths && device_out[r].bitwise_equal(host_out[r]);
    same_volumes = same_volumes && device_out[r].bitwise_equal(row_out[r]);
  }
  expect(same_runs, "the same inputs give bitwise-identical outputs run after run, on every rank");
  expect(same_graph, "a CUDA-graph replay of the device path gives the eager output bitwise");
  expect(same_paths, "the device and host dispatch paths give bitwise-identical outputs");
  expect(same_volumes, "the device exchange gives the same bits with a token once per rank and a row per expert");
  check_against_oracle(c, world, step, weights, routing, device_out);
  const std::vector<StepPlan> sequential_plans =
      plan_detail::compile_sequential_at(world, routing, PlanOptions{}, plan_detail::gpu_sequential_shape(world.layer, 0, 0, volume));
  const std::vector<StepPlan> row_plans_host = plan_detail::compile_sequential_at(
      world, routing, PlanOptions{}, plan_detail::gpu_sequential_shape(world.layer, 0, 0, DispatchVolume::RowPerExpert));
  check_device_plans(c, world, step, weights, routing, std::move(device_plans), sequential_plans, device_out,
                     "sequential, device dispatch", volume);
  check_device_plans(c, world, step, weights, routing, std::move(host_path_plans), row_plans_host, host_out,
                     "sequential, host dispatch", DispatchVolume::RowPerExpert);
  check_device_plans(c, world, step, weights, routing, std::move(row_plans), row_plans_host, row_out,
                     "sequential, device dispatch, a row per expert", DispatchVolume::RowPerExpert);
  if (c.ranks > 1) comet_case(c, world, step, weights, config, vw, device_out, volume);

  if (!with_tile_signal) return;
  // the tile-signal overlap in a world of its own (a failure here leaves the sequential
  // results above already judged): two steps (its flags are reset per step) and a graph replay
  const int before_overlap = failures();
  on_every_rank(vw, [&](int r) {
    const auto ri = static_cast<std::size_t>(r);
    const std::int64_t T = world.tokens_per_rank[ri];
    cuda::RankTransport& transport = vw.rank(r);
    transport.bind_thread();
    RankBuffers b(step.inputs[ri], step.logits[ri], T, c.hidden, transport.stream(cuda::RankStream::Main));
    cuda::EpMoeLayerOptions overlap;
    overlap.strategy = Strategy::TileSignal;
    overlap.tile_signal.bands_per_segment = c.ranks % 2 == 0 ? 2 : 1;
    overlap.tile_signal.band_block = c.ranks == 4 ? 2 : 0;  // the smallest blocks, and the strategy's rule
    {
      cuda::EpMoeLayer ts_layer(config, weights, transport, overlap);
      if (r == 0) description[ri] = ts_layer.description();
      eager_and_replayed(ts_layer, transport, b, T, c.hidden, 2, {&tile_out[ri], &tile_second_out[ri]}, tile_graph_out[ri]);
      tile_plans[ri] = cuda::EpMoeLayerInspector::last_device_plan(ts_layer, b.stream);  // as the graph replay compiled it
      if (r == 0) tile_schedule = cuda::EpMoeLayerInspector::tile_signal_schedule(ts_layer);
    }
    transport.host_barrier();
  });
  if (failures() > before_overlap) return;
  std::printf("  %s\n", description[0].c_str());
  bool same_tile = true;
  for (std::size_t r = 0; r < n; ++r) {
    same_tile = same_tile && device_out[r].bitwise_equal(tile_out[r]) && device_out[r].bitwise_equal(tile_second_out[r]) &&
                device_out[r].bitwise_equal(tile_graph_out[r]);
  }
  expect(same_tile, "tile_signal gives the sequential output bitwise (two steps and a graph replay)");
  const std::vector<StepPlan> tile_host_plans = plan_detail::compile_tile_signal_at(
      world, routing, PlanOptions{},
      plan_detail::gpu_tile_signal_shape(world.layer, 0, 0, tile_schedule.band_block, tile_schedule.bands_per_segment, volume));
  check_device_plans(c, world, step, weights, routing, std::move(tile_plans), tile_host_plans, tile_out, "tile_signal", volume);
}

// A fault on one rank: every rank's step must fail with an error whose message names the faulty
// rank, and the failed layer must refuse another forward.
//  Silent:              the rank's exchange kernels send nothing (a stalled or dead peer): a
//                       Timeout error within the timeout;
//  UnsignalledBandWait: a corrupted device plan (tile_signal): the rank's consumer waits for a
//                       band flag no GEMM tile raises; a Timeout, its own error names that wait;
//  UnrunnableSegment:   a corrupted device plan (sequential): the rank's first dispatch segment
//                       names a flag the exchange does not hold; an Internal error naming that
//                       segment on every rank, well before the timeout.
//  SilentRows:          comet, a row per expert: the rank sends its counts, then no rows; its
//                       peers' GEMM0 tiles wait for its rows inside the GEMM: a Timeout naming it.
enum class Fault { Silent, UnsignalledBandWait, UnrunnableSegment, SilentRows };

void faulty_rank_is_named(int ranks, int faulty, Fault fault) {
  std::printf("%s rank %d of %d\n",
              fault == Fault::Silent                ? "silent"
              : fault == Fault::UnsignalledBandWait ? "unsignalled band wait on"
              : fault == Fault::SilentRows          ? "comet, rows silent on"
                                                    : "unrunnable segment on",
              faulty, ranks);
  EpWorld world;
  world.layer = {.tokens = 0, .hidden = 256, .ffn_hidden = 256, .num_experts = 2 * ranks, .top_k = 2};
  world.tokens_per_rank.assign(static_cast<std::size_t>(ranks), 64);
  const SyntheticStep step = synthetic_step(world, RoutingPattern::Balanced, 11);
  MoeConfig config = world.layer;
  config.tokens = 64;
  const auto timeout = 1000ms;
  cuda::EpMoeLayerOptions comet;
  comet.strategy = Strategy::Comet;
  comet.dispatch_volume = DispatchVolume::RowPerExpert;
  cuda::VirtualWorld vw(ranks, cuda::EpMoeLayer::region_bytes(config, ranks, fault == Fault::SilentRows ? comet : cuda::EpMoeLayerOptions{}), 0,
                        {timeout});
  std::vector<std::string> message(static_cast<std::size_t>(ranks));
  std::vector<int> kind(static_cast<std::size_t>(ranks), -1);
  std::vector<double> seconds(static_cast<std::size_t>(ranks), 0);
  on_every_rank(vw, [&](int r) {
    const auto ri = static_cast<std::size_t>(r);
    RankBuffers b(step.inputs[ri], step.logits[ri], 64, config.hidden, vw.rank(r).stream(cuda::RankStream::Main));
    cuda::EpMoeLayerOptions options;
    cuda::EpMoeLayerHarness harness;
    if (fault == Fault::Silent) {
      harness.silent = r == faulty;
    } else if (fault == Fault::UnrunnableSegment) {
      harness.unrunnable_dispatch_segment = r == faulty;
    } else if (fault == Fault::SilentRows) {
      options = comet;
      harness.silent_rows = r == faulty;
    } else {
      options.strategy = Strategy::TileSignal;
      options.tile_signal.consumer_ctas = 2;
      harness.unsignalled_band_wait = r == faulty;
    }
    cuda::EpMoeLayer layer(config, cuda::RandomDeviceWeights{5}, vw.rank(r), options, harness);
    const auto start = std::chrono::steady_clock::now();
    try {
      layer.forward(b.stream, b.input, b.logits, b.output, 64);
      layer.check(b.stream);
    } catch (const Error& e) {
      message[ri] = e.what();
      kind[ri] = static_cast<int>(e.kind());
    }
    seconds[ri] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    bool refused = false;
    try {
      layer.forward(b.stream, b.input, b.logits, b.output, 64);
    } catch (const Error&) {
      refused = true;
    }
    if (!refused) throw std::runtime_error("a layer whose step failed accepted another forward");
    vw.rank(r).host_barrier();
  });
  const std::string name = "of rank " + std::to_string(faulty);
  const std::string own_wait = "the GEMM tile ready flags of rank " + std::to_string(faulty);
  if (fault == Fault::UnsignalledBandWait) {
    std::printf("  the faulty rank's own band wait %s\n",
                message[static_cast<std::size_t>(faulty)].find(own_wait) != std::string::npos ? "expired first and is named"
                                                                                                : "lost the race to a peer's wait for it");
  }
  if (fault == Fault::UnrunnableSegment) {
    const std::string refusal = "rank " + std::to_string(faulty) + " cannot run entry 0 of its plan";
    for (int r = 0; r < ranks; ++r) {
      const auto ri = static_cast<std::size_t>(r);
      expect(kind[ri] == static_cast<int>(ErrorKind::Internal) && message[ri].find(refusal) != std::string::npos &&
                 seconds[ri] < 0.9 * std::chrono::duration<double>(timeout).count(),
             "rank " + std::to_string(r) + " failed after " + std::to_string(seconds[ri]) + " s: " + message[ri]);
    }
    return;
  }
  for (int r = 0; r < ranks; ++r) {
    const auto ri = static_cast<std::size_t>(r);
    // With the corrupted plan, the faulty rank's own band wait and a peer's wait for its combine
    // rows run out within microseconds of each other (the same bound, started about together):
    // whichever expires first is the timeout, the other stops as aborted. Either names the
    // faulty rank (seen both ways on the H100, 2026-12-06); when its own wait wins, the message
    // says which wait ("the GEMM tile ready flags of rank R"), as the line below tells.
    const bool named = message[ri].find(name) != std::string::npos;
    expect(kind[ri] == static_cast<int>(ErrorKind::Timeout) && named && seconds[ri] < 1.0 + 4.0,
           "rank " + std::to_string(r) + " failed after " + std::to_string(seconds[ri]) + " s: " + message[ri]);
  }
}


// A receive capacity below what the routing needs: every rank's step fails with a bad-input
// error naming it, on both dispatch paths, and nobody waits out a timeout.
void capacity_is_enforced() {
  std::printf("receive capacity\n");
  EpWorld world;
  world.layer = {.tokens = 0, .hidden = 128, .ffn_hidden = 128, .num_experts = 4, .top_k = 1};
  world.tokens_per_rank.assign(2, 100);
  const SyntheticStep step = synthetic_step(world, RoutingPattern::OneExpert, 13);  // all to expert 0, on rank 0
  MoeConfig config = world.layer;
  config.tokens = 100;
  for (cuda::DispatchPath path : {cuda::DispatchPath::Device, cuda::DispatchPath::Host}) {
    cuda::EpMoeLayerOptions options;
    options.dispatch = path;
    options.receive_rows = 150;  // rank 0 would receive 200
    cuda::VirtualWorld vw(2, cuda::EpMoeLayer::region_bytes(config, 2, options), 0, {world_timeout});
    std::vector<std::string> message(2);
    std::vector<double> seconds(2);
    on_every_rank(vw, [&](int r) {
      const auto ri = static_cast<std::size_t>(r);
      RankBuffers b(step.inputs[ri], step.logits[ri], 100, config.hidden, vw.rank(r).stream(cuda::RankStream::Main));
      cuda::EpMoeLayer layer(config, cuda::RandomDeviceWeights{3}, vw.rank(r), options);
      const auto start = std::chrono::steady_clock::now();
      try {
        layer.forward(b.stream, b.input, b.logits, b.output, 100);
        layer.check(b.stream);
      } catch (const Error& e) {
        if (e.kind() == ErrorKind::BadInput) message[ri] = e.what();
      }
      seconds[ri] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      vw.rank(r).host_barrier();
    });
    for (int r = 0; r < 2; ++r) {
      const auto ri = static_cast<std::size_t>(r);
      expect(message[ri].find("200 rows to rank 0, more than its receive capacity of 150") != std::string::npos && seconds[ri] < 2.0,
             std::string(cuda::dispatch_path_name(path)) + " dispatch, rank " + std::to_string(r) + ": " + message[ri]);
    }
  }
}

void bad_input_is_refused() {
  std::printf("bad input\n");
  MoeConfig config{.tokens = 16, .hidden = 64, .ffn_hidden = 64, .num_experts = 8, .top_k = 2};
  cuda::VirtualWorld vw(2, cuda::EpMoeLayer::region_bytes(config, 2));
  auto refused = [&](const std::function<void()>& f, const char* needle) {
    try {
      f();
    } catch (const Error& e) {
      return e.kind() == ErrorKind::BadInput && std::strstr(e.what(), needle) != nullptr;
    }
    return false;
  };
  MoeConfig odd = config;
  odd.num_experts = 7;
  odd.top_k = 2;
  expect(refused([&] { cuda::EpMoeLayer l(odd, cuda::RandomDeviceWeights{}, vw.rank(0)); }, "divide evenly"),
         "experts that do not divide over the ranks are refused");
  MoeConfig big = config;
  big.tokens = 1 << 16;
  expect(refused([&] { cuda::EpMoeLayer l(big, cuda::RandomDeviceWeights{}, vw.rank(0)); }, "EpMoeLayer::region_bytes"),
         "a region too small for the layer is refused");
  cuda::EpMoeLayerOptions greedy;
  greedy.exchange_ctas_per_peer = 100000;
  expect(refused([&] { cuda::EpMoeLayer l(config, cuda::RandomDeviceWeights{}, vw.rank(0), greedy); }, "do not fit"),
         "exchange CTAs that cannot all be resident are refused");
  expect(refused([] { cuda::VirtualWorld w(17, 1 << 20); }, "1 to 16"), "more than 16 virtual ranks are refused");
  // comet's exchange serves every peer from a few CTAs: CTAs per peer, or more CTAs than leave
  // the GEMM beside them a 2-SM cluster, are refused
  cuda::EpMoeLayerOptions wide_comet;
  wide_comet.strategy = Strategy::Comet;
  wide_comet.exchange_ctas_per_peer = 2;
  cuda::VirtualWorld comet_world(2, cuda::EpMoeLayer::region_bytes(config, 2, wide_comet));
  expect(refused([&] { cuda::EpMoeLayer l(config, cuda::RandomDeviceWeights{}, comet_world.rank(0), wide_comet); },
                 "leave exchange_ctas_per_peer at 0"),
         "comet refuses exchange CTAs per peer");
  wide_comet.exchange_ctas_per_peer = 0;
  wide_comet.comet.dispatch_ctas = 1000;
  expect(refused([&] { cuda::EpMoeLayer l(config, cuda::RandomDeviceWeights{}, comet_world.rank(0), wide_comet); },
                 "dispatch_ctas = 1000"),
         "comet refuses dispatch CTAs that leave GEMM0 no cluster");
  // tile_signal consumers of ranks sharing the SMs: together at most half of them (checked
  // after the ranks agree on their settings, so on every rank)
  std::vector<int> crowded_refused(2, 0);
  cuda::EpMoeLayerOptions crowded;
  crowded.strategy = Strategy::TileSignal;
  crowded.tile_signal.consumer_ctas = 80;
  on_every_rank(vw, [&](int r) {
    crowded_refused[static_cast<std::size_t>(r)] =
        refused([&] { cuda::EpMoeLayer l(config, cuda::RandomDeviceWeights{}, vw.rank(r), crowded); }, "more than half");
  });
  expect(crowded_refused[0] && crowded_refused[1], "consumer CTAs of ranks sharing SMs beyond half of them are refused on every rank");
  // a stream of the rank's own making, not the world's (it could share a hardware queue with a
  // peer's waiting kernel): refused before anything is enqueued
  bool stream_refused = false;
  on_every_rank(vw, [&](int r) {
    cuda::EpMoeLayer layer(config, cuda::RandomDeviceWeights{}, vw.rank(r));
    if (r == 0) {
      cudaStream_t own;
      TILEMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
      stream_refused = refused([&] { layer.forward(own, nullptr, nullptr, nullptr, 0); }, "world's stream");
      cudaStreamDestroy(own);
    }
    vw.rank(r).host_barrier();
  });
  expect(stream_refused, "a forward on a stream other than the world's is refused");
}

// A rank that fails before a host barrier (an allocation the GPU cannot serve, say) abandons the
// world: its peer leaves the barrier at once with an error of the same kind naming it, not a
// timeout after the world's 10 s, and each rank's own error comes back from run_ranks.
void failed_rank_frees_its_peers() {
  std::printf("failed rank\n");
  MoeConfig config{.tokens = 16, .hidden = 64, .ffn_hidden = 64, .num_experts = 8, .top_k = 2};
  cuda::VirtualWorld vw(2, cuda::EpMoeLayer::region_bytes(config, 2), 0, {std::chrono::milliseconds(10000)});
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::exception_ptr> errors = vw.run_ranks([&](cuda::RankTransport& transport) {
    if (transport.rank() == 1) throw_bad_input("rank 1 gives up before the barrier");
    transport.host_barrier();
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const ErrorReport own = errors[1] ? report_of(errors[1]) : ErrorReport{};
  const ErrorReport peer = errors[0] ? report_of(errors[0]) : ErrorReport{};
  expect(errors[1] && own.kind == ErrorKind::BadInput && own.message == "rank 1 gives up before the barrier",
         "the failing rank's own error comes back: " + own.message);
  expect(errors[0] && peer.kind == ErrorKind::BadInput &&
             peer.message.find("rank 1 failed: rank 1 gives up before the barrier") != std::string::npos,
         "its peer's error names it and its reason, and is of its kind (bad input): " + peer.message);
  expect(seconds < 2.0, "the peer left the barrier at once (" + std::to_string(seconds) + " s, timeout 10 s)");
}

}  // namespace

// EpMoeLayer::device_bytes, with which the CLI refuses a world too large for the GPU, must never
// count less than the ranks' layers take (cudaMemGetInfo before and after building them, the
// world's regions already allocated), nor much more.
void device_memory_estimates_hold() {
  std::printf("device memory estimate\n");
  const MoeConfig config{.tokens = 2048, .hidden = 2048, .ffn_hidden = 2048, .num_experts = 8, .top_k = 2};
  const int ranks = 4;
  for (const Strategy strategy : {Strategy::Sequential, Strategy::TileSignal, Strategy::Comet}) {
    for (const cuda::DispatchPath path : {cuda::DispatchPath::Device, cuda::DispatchPath::Host}) {
      if (strategy != Strategy::Sequential && path == cuda::DispatchPath::Host) continue;  // (the device dispatch's strategies)
      if (strategy == Strategy::TileSignal && !with_tile_signal) continue;
      cuda::EpMoeLayerOptions options;
      options.dispatch = path;
      options.strategy = strategy;
      options.record_trace = true;
      cuda::VirtualWorld vw(ranks, cuda::EpMoeLayer::region_bytes(config, ranks, options), 0, {world_timeout});
      TILEMOE_CUDA_CHECK(cudaDeviceSynchronize());
      std::size_t free_before = 0, free_after = 0, total = 0;
      TILEMOE_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
      on_every_rank(vw, [&](int r) {
        cuda::EpMoeLayer layer(config, cuda::RandomDeviceWeights{3}, vw.rank(r), options);
        vw.rank(r).host_barrier();  // every rank's layer built
        if (r == 0) {
          TILEMOE_CUDA_CHECK(cudaDeviceSynchronize());
          TILEMOE_CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
        }
        vw.rank(r).host_barrier();  // measured before any is freed
      });
      const std::size_t used = free_before - free_after;
      const std::size_t estimate = ranks * cuda::EpMoeLayer::device_bytes(config, ranks, options);
      char text[240];
      std::snprintf(text, sizeof text, "%s, %s dispatch, %d ranks: estimate %.1f MiB, the layers took %.1f MiB",
                    std::string(strategy_name(strategy)).c_str(), cuda::dispatch_path_name(path), ranks, estimate / 1048576.0,
                    used / 1048576.0);
      // over by at most 10% and the page rounding of each rank's ~40 small arrays
      expect(used <= estimate && estimate <= used + used / 10 + ranks * (std::size_t{96} << 20), text);
    }
  }
}

// A world of one skips both exchange copies (its expert rows are the permuted rows): it must
// give the one-GPU layer's bits, eagerly and replayed from a CUDA graph, for several shapes.
void world_of_one_is_the_one_gpu_layer() {
  std::printf("a world of one\n");
  for (const MoeConfig& config : {MoeConfig{.tokens = 300, .hidden = 512, .ffn_hidden = 768, .num_experts = 16, .top_k = 4},
                                  MoeConfig{.tokens = 129, .hidden = 256, .ffn_hidden = 512, .num_experts = 8, .top_k = 1},
                                  MoeConfig{.tokens = 7, .hidden = 8, .ffn_hidden = 8, .num_experts = 4, .top_k = 2}}) {
    EpWorld world;
    world.layer = config;
    world.layer.tokens = 0;
    world.tokens_per_rank = {config.tokens};
    const SyntheticStep step = synthetic_step(world, RoutingPattern::Skewed, 21);
    cuda::VirtualWorld vw(1, cuda::EpMoeLayer::region_bytes(config, 1), 0, {world_timeout});
    std::vector<Matrix> eager(1), second(1), replayed(1);
    std::vector<Routing> routing(1);
    std::vector<StepPlan> device_plan(1);
    Matrix one_gpu;
    std::string description;
    on_every_rank(vw, [&](int r) {
      cuda::RankTransport& transport = vw.rank(r);
      transport.bind_thread();
      RankBuffers b(step.inputs[0], step.logits[0], config.tokens, config.hidden, transport.stream(cuda::RankStream::Main));
      {
        cuda::MoeLayer layer(config, cuda::RandomDeviceWeights{9});
        b.poison();
        layer.forward(b.stream, b.input, b.logits, b.output, config.tokens);
        layer.check(b.stream);
        one_gpu = b.read(config.tokens, config.hidden);
      }
      cuda::EpMoeLayerHarness build_plan;
      build_plan.build_device_plan = true;
      cuda::EpMoeLayer layer(config, cuda::RandomDeviceWeights{9}, transport, {}, build_plan);
      description = layer.description();
      eager_and_replayed(layer, transport, b, config.tokens, config.hidden, 2, {&eager[0], &second[0]}, replayed[0]);
      routing[0] = layer.last_routing(b.stream, config.tokens);
      device_plan[0] = cuda::EpMoeLayerInspector::last_device_plan(layer, b.stream);
    });
    expect(eager[0].bitwise_equal(one_gpu) && second[0].bitwise_equal(one_gpu) && replayed[0].bitwise_equal(one_gpu),
           std::to_string(config.tokens) + " tokens, hidden " + std::to_string(config.hidden) +
               ": the world of one gives the one-GPU layer's bits (two steps and a graph replay); " + description);
    // the plan compiled from the layer's own offsets (no exchange in a world of one)
    const std::string difference = plan_detail::first_table_difference(
        device_plan[0],
        plan_detail::compile_sequential_at(world, routing, PlanOptions{},
                                           plan_detail::gpu_sequential_shape(world.layer, 0, 0, DispatchVolume::RowPerExpert))[0]);
    plan_detail::add_token_tables(device_plan[0], routing, plan_detail::routing_counts(routing, static_cast<int>(config.num_experts)),
                                  DispatchVolume::RowPerExpert, plan_detail::DispatchOrder::Ascending, false);
    bool valid = true;
    try {
      validate_plan(device_plan);
    } catch (const Error& e) {
      valid = false;
      std::printf("  validate_plan: %s\n", e.what());
    }
    expect(difference.empty() && valid, std::to_string(config.tokens) + " tokens: the world of one's device-built plan equals the "
                                        "host compiler's and passes validate_plan " + difference);
  }
}

// A layer that adds to the routing or the experts (a capacity rule, a shared expert) on 4 ranks,
// one of them without tokens: sequential with either dispatch volume and tile_signal give the
// same bits, and the outputs match the CPU executor and fp64 on the GPU's routing (its kept slots
// included: they must be the CPU rule's on the GPU's choices).
void layer_variant_on_every_rank(const char* what, const EpWorld& world, const ExpertWeights& weights, std::uint64_t seed) {
  std::printf("%s on 4 ranks\n", what);
  MoeConfig config = world.layer;
  config.tokens = *std::max_element(world.tokens_per_rank.begin(), world.tokens_per_rank.end());
  const SyntheticStep step = synthetic_step(world, RoutingPattern::Skewed, seed);
  cuda::EpMoeLayerOptions comet;
  comet.strategy = Strategy::Comet;
  cuda::VirtualWorld vw(4, std::max(cuda::EpMoeLayer::region_bytes(config, 4), cuda::EpMoeLayer::region_bytes(config, 4, comet)), 0,
                        {world_timeout});
  struct Variant {
    Strategy strategy;
    DispatchVolume volume;
  };
  std::vector<Variant> variants = {{Strategy::Sequential, DispatchVolume::OncePerRank}, {Strategy::Sequential, DispatchVolume::RowPerExpert}};
  if (with_tile_signal) variants.push_back({Strategy::TileSignal, DispatchVolume::OncePerRank});
  if (!world.layer.router.scales_input) variants.push_back({Strategy::Comet, DispatchVolume::OncePerRank});  // (comet refuses it)
  std::vector<std::vector<Matrix>> out(variants.size(), std::vector<Matrix>(4));
  std::vector<Routing> routing(4);
  on_every_rank(vw, [&](int r) {
    const auto ri = static_cast<std::size_t>(r);
    const std::int64_t T = world.tokens_per_rank[ri];
    cuda::RankTransport& transport = vw.rank(r);
    transport.bind_thread();
    RankBuffers b(step.inputs[ri], step.logits[ri], T, config.hidden, transport.stream(cuda::RankStream::Main));
    for (std::size_t v = 0; v < variants.size(); ++v) {
      cuda::EpMoeLayerOptions options;
      options.strategy = variants[v].strategy;
      options.dispatch_volume = variants[v].volume;
      cuda::EpMoeLayer layer(config, weights, transport, options);
      b.poison();
      layer.forward(b.stream, b.input, b.logits, b.output, T);
      layer.check(b.stream);
      out[v][ri] = b.read(T, config.hidden);
      if (v == 0) routing[ri] = layer.last_routing(b.stream, T);
      transport.host_barrier();
    }
    transport.host_barrier();
  });
  // the GPU kept the slots the CPU's rule keeps of the GPU's choices
  std::int64_t differ = 0, dropped = 0;
  for (int r = 0; r < 4; ++r) {
    Routing cpu = routing[static_cast<std::size_t>(r)];
    apply_capacity(world.rank_config(r), cpu);
    for (std::size_t s = 0; s < cpu.kept.size(); ++s) {
      differ += cpu.kept[s] != routing[static_cast<std::size_t>(r)].kept[s];
      dropped += cpu.kept[s] == 0;
    }
  }
  expect(differ == 0, std::string(what) + ": the GPU keeps the CPU rule's slots (" + std::to_string(dropped) + " dropped, " +
                          std::to_string(differ) + " differ)");
  const cases::OracleErrors e = cases::oracle_errors(world, step.inputs, routing, weights, out[0], cases::kBf16Tolerance);
  expect(e.within_tolerance(), std::string(what) + ": the outputs against the CPU executor and fp64 (" + e.describe() + ")");
  bool same = true;
  std::string which = "a row per expert";
  for (std::size_t v = 1; v < variants.size(); ++v) {
    for (std::size_t r = 0; r < 4; ++r) same = same && out[0][r].bitwise_equal(out[v][r]);
    if (variants[v].strategy != Strategy::Sequential) (which += ", ") += strategy_name(variants[v].strategy);
  }
  expect(same, std::string(what) + ": " + which + " give the sequential output bitwise");
}

// The GShard capacity rule (routing.hpp), a gated shared expert, Llama-4's input scaling and
// GPT-OSS's experts, each on 4 ranks.
void layer_variants_on_every_rank(std::uint64_t seed) {
  EpWorld world;
  world.layer = {.tokens = 0, .hidden = 256, .ffn_hidden = 128, .num_experts = 16, .top_k = 4};
  world.tokens_per_rank = {70, 41, 0, 64};
  EpWorld dropping = world;
  dropping.layer.capacity_factor = 0.75;  // skewed routing overfills the popular experts
  layer_variant_on_every_rank("capacity factor 0.75", dropping, random_weights(dropping.layer, seed + 1), seed);
  ExpertWeights weights = random_weights(world.layer, seed + 3);
  weights.shared = cases::random_shared_expert(world.layer, 192, true, seed + 4);
  layer_variant_on_every_rank("a gated shared expert", world, weights, seed + 5);
  EpWorld llama4 = world;
  llama4.layer.top_k = 1;
  llama4.layer.renormalize = false;
  llama4.layer.router.score = ScoreFunction::Sigmoid;
  llama4.layer.router.scales_input = true;
  layer_variant_on_every_rank("Llama-4's input scaling", llama4, random_weights(llama4.layer, seed + 6), seed + 8);
  EpWorld gpt_oss = world;
  gpt_oss.layer.swiglu = {7.0f, 1.702f, 1.0f};
  layer_variant_on_every_rank("GPT-OSS's biases and clamped SwiGLU", gpt_oss, cases::biased_weights(gpt_oss.layer, seed + 9), seed + 10);
}

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a line at a time: a run cut short by a timeout still shows how far it got
  // --small: small cases only, for compute-sanitizer; --timeout-s S: the worlds' wait bound;
  // --no-tile-signal: the sequential paths only; --case ID (repeatable): those cases of the
  // registry (tests/cases: any expert-parallel case, a benchmark's too) and no other check;
  // --list: the cases that would run
  cuda::prepare_cuda_environment();
  bool small = false, list = false;
  std::vector<std::string> ids;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--small")) {
      small = true;
    } else if (!std::strcmp(argv[i], "--no-tile-signal")) {
      with_tile_signal = false;
    } else if (!std::strcmp(argv[i], "--list")) {
      list = true;
    } else if (!std::strcmp(argv[i], "--timeout-s") && i + 1 < argc) {
      world_timeout = std::chrono::milliseconds(std::atol(argv[++i]) * 1000);
    } else if (!std::strcmp(argv[i], "--case") && i + 1 < argc) {
      ids.emplace_back(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--small] [--no-tile-signal] [--timeout-s S] [--case ID ...] [--list]\n", argv[0]);
      return 2;
    }
  }
  std::vector<cases::MoeCase> chosen;
  try {
    chosen = cases::select_cases(true, cases::kTest, ids);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  // --small keeps the partitioned cases of at most 4 ranks too (their racecheck is the point)
  if (small) std::erase_if(chosen, [](const cases::MoeCase& c) { return !c.small() && (c.sms_per_rank == 0 || c.ranks > 4); });
  if (list) {
    for (const cases::MoeCase& c : chosen) std::printf("%s\n", c.id().c_str());
    return 0;
  }
  cudaDeviceProp prop;
  if (!sm90_device_or_skip(prop, "the expert-parallel layer test")) return 77;
  try {
    const auto seed = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::printf("seed %llu (fresh random data every run)\n", static_cast<unsigned long long>(seed));
    const auto run = [&](const cases::MoeCase& c) {
      run_case(c, seed + 1000 * (cases::registry_place(c) + 1));
    };
    for (const cases::MoeCase& c : chosen) {
      if (c.sms_per_rank == 0) run(c);
    }
    if (ids.empty()) {
      faulty_rank_is_named(4, 2, Fault::Silent);
      if (!small) faulty_rank_is_named(8, 7, Fault::Silent);
      if (with_tile_signal) faulty_rank_is_named(4, 1, Fault::UnsignalledBandWait);
      faulty_rank_is_named(4, 2, Fault::SilentRows);
      faulty_rank_is_named(4, 3, Fault::UnrunnableSegment);
      capacity_is_enforced();
      if (!small) device_memory_estimates_hold();
      world_of_one_is_the_one_gpu_layer();
      layer_variants_on_every_rank(seed + 7);
      bad_input_is_refused();
      failed_rank_frees_its_peers();
    }
    // last: a driver without usable green contexts would fail these, and nothing else
    for (const cases::MoeCase& c : chosen) {
      if (c.sms_per_rank > 0) run(c);
    }
  } catch (const std::exception& e) {
    gpu_checks::fail(std::string("unexpected exception: ") + e.what());
  }
  return gpu_checks::verdict();
}
