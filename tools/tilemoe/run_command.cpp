// tilemoe run: one forward MoE step on the CPU engine for each chosen strategy, each checked
// against the dense reference (bitwise) and an fp64 reference (accuracy).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#ifdef TILEMOE_WITH_CUDA
#include "cuda_step.hpp"
#endif
#include "progress.hpp"
#include "step_options.hpp"
#include "tilemoe/cpu_executor.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/reference.hpp"
#include "tilemoe/shared_expert.hpp"
#include "tilemoe/step_io.hpp"
#include "tilemoe/step_trace.hpp"
#include "tilemoe/token_sample.hpp"
#include "tilemoe/trace.hpp"

namespace tilemoe::cli {

namespace {

// The references (threaded over tokens) cost about as much as a CPU step: the fp64 one 3.6 s
// for 1.3e10 multiply-adds on 2 cores. Beyond --reference-work multiply-adds they run on a sample
// of the tokens (include/tilemoe/token_sample.hpp), so that large runs stay practical and the
// report says so; the CPU engine's bitwise check against the dense reference still covers every
// token.
constexpr double kDefaultReferenceWork = 1.6e10;

struct RunOptions {
  StepOptions step;
  std::string backend = "cpu";
  std::string strategy = "all";
  std::string output_path, trace_path;
  bool json = false;
  std::int64_t timeout_ms = 30000;
  double reference_work = kDefaultReferenceWork;  // --reference-work
  std::uint32_t delay_us = 0;
  // About the H200's balance of NVLink bytes to bf16 FLOPs (370 GB/s : 790 TFLOP/s), scaled
  // to the ~25 GFLOP/s of the CPU engine on two cores, so the default run shows real overlap.
  double link_mbps = 12.0;
  std::string transport = "virtual";  // --backend cuda, several ranks
  std::string dispatch = "device";    // --backend cuda, several ranks
  double link_gbps = 0.0;           // --backend cuda, virtual ranks
  int sms_per_rank = 0;             // --backend cuda, virtual ranks
  int silent_rank = -1;             // --backend cuda, several ranks: fault injection
};

struct StrategyResult {
  Strategy strategy;
  std::vector<StepPlan> plans;
  StepRun run;
  StepStats stats;
  ErrorStats vs_dense;
  ErrorStats vs_fp64;
  bool bitwise = false;
};

// The longest --timeout-ms: a day.
constexpr std::int64_t kMaxTimeoutMs = 24LL * 3600 * 1000;

// The rows the routing keeps, over all ranks.
std::int64_t routed_rows(const std::vector<Routing>& routing) {
  std::int64_t routed = 0;
  for (const Routing& r : routing) {
    for (std::uint8_t kept : r.kept) routed += kept;
  }
  return routed;
}

// The fp64 reference of the tokens the work bound affords (every token where it fits).
struct Fp64Check {
  TokenSample sample;
  std::vector<std::vector<double>> values;  // per rank, the sampled tokens' rows

  double max_work;

  Fp64Check(const EpWorld& world, const std::vector<Matrix>& inputs, const std::vector<Routing>& routing,
            const ExpertWeights& weights, double max_work)
      : sample(sample_tokens(world, routing, max_work)), max_work(max_work) {
    ProgressBar bar("fp64 reference");
    const SampledStep sub = sampled_step(sample, world, inputs, routing);
    values = fp64_reference(sub.world, sub.inputs, sub.routing, weights);
  }
  ErrorStats error_of(const std::vector<Matrix>& outputs) const { return compare(sampled_rows(sample, outputs), values); }
  // the line under the table when the references did not see every token
  void print_sample_note(const char* what) const {
    if (sample.whole()) return;
    std::printf("%s on %lld of %lld tokens, evenly spaced on every rank: the references' work is bounded at %.1e multiply-adds\n",
                what, static_cast<long long>(sample.sampled), static_cast<long long>(sample.total), max_work);
  }
};

#ifdef TILEMOE_WITH_CUDA
CudaStepOptions cuda_step_options(const RunOptions& options) {
  CudaStepOptions cuda_options;
  cuda_options.transport = options.transport;
  cuda_options.strategy = options.strategy == "all" ? "sequential" : options.strategy;
  cuda_options.dispatch = options.dispatch;
  cuda_options.tile_signal = options.step.plan.tile_signal;
  cuda_options.comet = options.step.plan.comet;
  cuda_options.link_gbps = options.link_gbps;
  cuda_options.sms_per_rank = options.sms_per_rank;
  cuda_options.trace = !options.trace_path.empty();
  cuda_options.timeout_ms = options.timeout_ms;
  cuda_options.silent_rank = options.silent_rank;
  cuda_options.dispatch_volume = given_dispatch_volume(options.step);
  return cuda_options;
}
#endif

// --backend cuda: the GPU forward of one rank, checked against the CPU executor and fp64 on the
// routing the GPU chose (across backends the criterion is bf16 tolerance, not bitwise).
int run_cuda(const RunOptions& options, const PreparedStep& step) {
#ifdef TILEMOE_WITH_CUDA
  const CudaStepOptions cuda_options = cuda_step_options(options);
  const CudaStepOutput gpu = run_cuda_step(step, cuda_options);
  // The CPU executor and fp64 on the routing the GPU chose, on the tokens the work bound affords:
  // the GPU's step takes milliseconds, the host's references over every token at DeepSeek-V3's
  // shape would take minutes.
  const Fp64Check fp64(step.world, step.inputs, gpu.routing, step.weights, options.reference_work);
  const SampledStep sub = sampled_step(fp64.sample, step.world, step.inputs, gpu.routing);
  StepRun cpu;
  {
    ProgressBar bar("cpu oracle");
    cpu = run_step(compile_plan(Strategy::Sequential, sub.world, sub.routing, options.step.plan), step.weights, sub.inputs);
  }
  const std::vector<Matrix> gpu_rows = sampled_rows(fp64.sample, gpu.outputs);
  const ErrorStats vs_cpu = compare(gpu_rows, cpu.outputs);
  const ErrorStats vs_fp64 = fp64.error_of(gpu.outputs);
  const bool ok = vs_cpu.finite && vs_cpu.relative_frobenius < 1e-2 && vs_fp64.finite && vs_fp64.relative_frobenius < 1e-2;
  int compared = 0, equal = 0;  // an overlap strategy against sequential, bit for bit
  for (int m : gpu.matches_sequential) {
    compared += m >= 0;
    equal += m == 1;
  }
  if (gpu.quiet) {
    // another rank of the world reports; this one only says whether its own part held
  } else if (options.json) {
    nlohmann::json doc = {{"backend", "cuda"}, {"ranks", step.world.world_size()}, {"how", gpu.description},
                          {"source", step.source}, {"forward_ms", gpu.forward_ms},
                          {"max_abs_error_vs_cpu", vs_cpu.max_abs}, {"relative_error_vs_cpu", vs_cpu.relative_frobenius},
                          {"relative_error_vs_fp64", vs_fp64.relative_frobenius},
                          {"tokens_checked", fp64.sample.sampled}, {"tokens", fp64.sample.total},
                          {"within_tolerance", ok},
                          {"ranks_bitwise_equal_to_sequential", equal}, {"ranks_compared_with_sequential", compared}};
    std::printf("%s\n", doc.dump(2).c_str());
  } else {
    std::printf("tilemoe run: backend cuda, %s; %lld tokens per rank, hidden %lld, ffn %lld, %lld experts, top-%lld, %s\n",
                gpu.description.c_str(), static_cast<long long>(step.world.tokens_per_rank[0]),
                static_cast<long long>(step.world.layer.hidden),
                static_cast<long long>(step.world.layer.ffn_hidden), static_cast<long long>(step.world.layer.num_experts),
                static_cast<long long>(step.world.layer.top_k), step.source.c_str());
    std::printf("%-12s %10s %16s %14s %14s %10s\n", "strategy", "gpu ms", "max|err| cpu", "rel err cpu", "rel err fp64", "tolerance");
    std::printf("%-12s %10.3f %16.3g %14.2e %14.2e %10s\n", cuda_options.strategy.c_str(), gpu.forward_ms, vs_cpu.max_abs,
                vs_cpu.relative_frobenius, vs_fp64.relative_frobenius, ok ? "ok" : "EXCEEDED");
    fp64.print_sample_note("the CPU executor and fp64 checked the GPU");
    if (compared > 0) {
      std::printf("bitwise equal to sequential on %d of %d rank(s)%s\n", equal, compared, equal == compared ? "" : ": MISMATCH");
    }
  }
  if (equal != compared) {
    std::fprintf(stderr, "tilemoe: the %s output differs from sequential; nothing written to --output\n", cuda_options.strategy.c_str());
    return 1;
  }
  if (!ok) {
    std::fprintf(stderr, "tilemoe: the GPU output is outside bf16 tolerance; nothing written to --output\n");
    return 1;
  }
  if (!options.output_path.empty() && !gpu.quiet) write_step_output(options.output_path, gpu.outputs);
  if (!options.trace_path.empty()) {
    // multi-process worlds: each process writes its own ranks, rank 0 at the path given
    const std::string path = gpu.quiet ? options.trace_path + ".rank" + std::to_string(gpu.spans.empty() ? 0 : gpu.spans.front().rank)
                                       : options.trace_path;
    write_device_trace(path, cuda_options.strategy, gpu.spans);
    if (!gpu.quiet && !options.json) {
      std::printf("trace: %s (open in https://ui.perfetto.dev); remote rows shipped while GEMM1 ran: %.0f%%\n", path.c_str(),
                  100.0 * hidden_share(gpu.spans, "GEMM1 tiles", "consumer"));
    }
  }
  return 0;
#else
  (void)options;
  (void)step;
  throw_bad_input("this build has no CUDA backend: build the cuda preset (make run PRESET=cuda) or use --backend cpu");
#endif
}

int run(const RunOptions& options) {
  if (options.backend != "cpu" && options.backend != "cuda") {
    throw_bad_input("unknown backend '" + options.backend + "': use cpu or cuda");
  }
  if (options.timeout_ms < 1) throw_bad_input("--timeout-ms must be at least 1");
  if (!std::isfinite(options.reference_work) || options.reference_work <= 0.0) {
    throw_bad_input("--reference-work must be a positive finite number of multiply-adds (e.g. 1.6e10)");
  }
  // Beyond a day a wait is no longer bounded in any useful sense, and far beyond it the
  // conversion to nanoseconds overflows.
  if (options.timeout_ms > kMaxTimeoutMs) {
    throw_bad_input("--timeout-ms " + std::to_string(options.timeout_ms) + " is more than a day: use at most " +
                    std::to_string(kMaxTimeoutMs));
  }
  for (const auto& [name, rate] : {std::pair{"--link-mbps", options.link_mbps}, std::pair{"--link-gbps", options.link_gbps}}) {
    if (!std::isfinite(rate) || rate < 0.0) {
      throw_bad_input(std::string(name) + " " + std::to_string(rate) + " is not a rate: use 0 (unlimited) or a positive number");
    }
  }
  if (static_cast<std::int64_t>(options.delay_us) >= options.timeout_ms * 1000) {
    throw_bad_input("--delay-us " + std::to_string(options.delay_us) + " is not shorter than --timeout-ms " +
                    std::to_string(options.timeout_ms) + ": every wait could expire by design; lower --delay-us or raise --timeout-ms");
  }
  if (options.backend == "cpu" &&
      (options.link_gbps != 0.0 || options.dispatch != "device" || options.transport != "virtual" || options.sms_per_rank != 0 ||
       options.silent_rank != -1)) {
    throw_bad_input("--transport, --dispatch, --sms-per-rank, --link-gbps and --silent-rank are options of --backend cuda; the CPU "
                    "engine's link is --link-mbps");
  }
  if (options.backend == "cpu" && (options.step.plan.comet.dispatch_ctas != 0 || options.step.plan.comet.send_ctas != 0)) {
    throw_bad_input("--comet-dispatch-ctas and --comet-send-ctas size comet's exchange on the GPU (--backend cuda); the CPU engine's "
                    "are --comm-workers");
  }
  // The fault is injected in the device-API exchange; the host path's all-to-all never sees
  // it, so the run passed as if no rank were silent. An option that cannot act is refused.
  if (options.backend == "cuda" && options.silent_rank >= 0 && options.dispatch == "host") {
    throw_bad_input("--silent-rank acts on the device-API exchange, which --dispatch host does not use: use --dispatch device "
                    "with --silent-rank, or drop it");
  }
  // The files are written only at the end: a path that cannot take them is refused now,
  // before the step runs, not after.
  if (!options.output_path.empty()) check_output_target(options.output_path, "--output");
  if (!options.trace_path.empty()) check_output_target(options.trace_path, "--trace");
  if (!options.output_path.empty() && !options.trace_path.empty() && same_output_target(options.output_path, options.trace_path)) {
    throw_bad_input("--output " + options.output_path + " and --trace " + options.trace_path +
                    " name the same file: give them different paths");
  }
  std::vector<Strategy> strategies;
  if (options.backend == "cpu") {
    if (options.strategy == "all") {
      strategies = {Strategy::Sequential, Strategy::TileSignal, Strategy::Comet};
    } else {
      strategies = {parse_strategy(options.strategy)};
    }
  }
  StepOptions step_options = options.step;
  step_options.strategies = std::max<int>(1, static_cast<int>(strategies.size()));
  step_options.cpu_engine = options.backend == "cpu";
  WorldCheck check_world;
#ifdef TILEMOE_WITH_CUDA
  if (options.backend == "cuda") {
    check_world = [&](const EpWorld& world, std::int64_t shared_ffn_hidden) {
      check_gpu_memory(world, cuda_step_options(options), shared_ffn_hidden);
    };
  }
#endif
  const PreparedStep step = prepare_step(step_options, check_world);
  if (options.backend == "cuda") return run_cuda(options, step);

  std::vector<Matrix> dense;
  {
    ProgressBar bar("dense reference");
    dense = dense_reference(step.world, step.inputs, step.routing, step.weights);
  }
  const MoeConfig& layer = step.world.layer;
  const std::int64_t routed = routed_rows(step.routing);
  const Fp64Check fp64(step.world, step.inputs, step.routing, step.weights, options.reference_work);

  std::vector<StrategyResult> results;
  for (Strategy strategy : strategies) {
    StrategyResult result{strategy, compile_plan(strategy, step.world, step.routing, options.step.plan), {}, {}, {}, {}, false};
    validate_plan(result.plans);
    std::uint64_t total = 0;
    for (const StepPlan& p : result.plans) total += p.task_count();
    std::atomic<std::uint64_t> done{0};
    CpuRunOptions run_options;
    run_options.timeout = std::chrono::milliseconds(options.timeout_ms);
    run_options.max_delay_us = options.delay_us;
    run_options.delay_seed = options.step.seed;
    run_options.link_gbps = options.link_mbps / 1e3;
    run_options.tasks_done = &done;
    {
      ProgressBar bar("running " + std::string(strategy_name(strategy)), total, done);
      result.run = run_step(result.plans, step.weights, step.inputs, run_options);
    }
    result.stats = summarize(result.plans, result.run.records, result.run.wall_ns);
    result.vs_dense = compare(result.run.outputs, dense);
    result.vs_fp64 = fp64.error_of(result.run.outputs);
    result.bitwise = true;
    for (std::size_t r = 0; r < dense.size(); ++r) result.bitwise = result.bitwise && result.run.outputs[r].bitwise_equal(dense[r]);
    results.push_back(std::move(result));
  }

  bool all_equal = true;
  for (const StrategyResult& r : results) all_equal = all_equal && r.bitwise && r.vs_dense.finite;

  if (options.json) {
    nlohmann::json doc;
    doc["layer"] = {{"ranks", step.world.world_size()}, {"tokens_per_rank", step.world.tokens_per_rank},
                    {"hidden", layer.hidden}, {"ffn_hidden", layer.ffn_hidden}, {"experts", layer.num_experts},
                    {"top_k", layer.top_k}, {"activation", activation_name(layer.activation)},
                    {"renormalize", layer.renormalize}, {"capacity_factor", layer.capacity_factor},
                    {"router", {{"score_function", score_function_name(layer.router.score)},
                                {"groups", layer.router.groups}, {"top_groups", layer.router.top_groups},
                                {"weights", router_weights_name(layer.router.weights)},
                                {"renormalize_epsilon", layer.router.renormalize_epsilon},
                                {"scaling", layer.router.scaling}}},
                    {"dtype", dtype_name(layer.dtype)}, {"routed_rows", routed}};
    doc["source"] = step.source;
    doc["backend"] = options.backend;
    for (const StrategyResult& r : results) {
      nlohmann::json entry = {{"strategy", strategy_name(r.strategy)}, {"wall_ms", r.stats.wall_ms},
                              {"compute_busy", r.stats.compute_busy}, {"comm_busy", r.stats.comm_busy},
                              {"overlap", r.stats.overlap}, {"max_abs_error_vs_dense", r.vs_dense.max_abs},
                              {"bitwise_equal_dense", r.bitwise}};
      entry["relative_error_vs_fp64"] = r.vs_fp64.relative_frobenius;
      doc["results"].push_back(entry);
    }
    doc["fp64_tokens_checked"] = fp64.sample.sampled;
    doc["all_bitwise_equal"] = all_equal;
    std::printf("%s\n", doc.dump(2).c_str());
  } else {
    std::printf("tilemoe run: backend %s, %d ranks, tokens/rank %s, hidden %lld, ffn %lld, %lld experts, top-%lld, %s, %s, %s\n",
                options.backend.c_str(), step.world.world_size(),
                [&] {
                  std::string t;
                  for (std::size_t i = 0; i < step.world.tokens_per_rank.size(); ++i) t += (i ? "," : "") + std::to_string(step.world.tokens_per_rank[i]);
                  return t;
                }().c_str(),
                static_cast<long long>(layer.hidden), static_cast<long long>(layer.ffn_hidden),
                static_cast<long long>(layer.num_experts), static_cast<long long>(layer.top_k),
                std::string(activation_name(layer.activation)).c_str(), std::string(dtype_name(layer.dtype)).c_str(),
                step.source.c_str());
    if (!layer.router.is_default()) {
      const RouterConfig& r = layer.router;
      std::printf("router: %s scores, weights = %s, %lld group(s) of which %lld kept, renormalised: %s (epsilon %g), scaled by %g\n",
                  std::string(score_function_name(r.score)).c_str(), std::string(router_weights_name(r.weights)).c_str(),
                  static_cast<long long>(r.groups), static_cast<long long>(r.top_groups), layer.renormalize ? "yes" : "no",
                  static_cast<double>(r.renormalize_epsilon), static_cast<double>(r.scaling));
    }
    const ExpertWeights& w = step.weights;
    if (!layer.swiglu.is_default() || w.has_biases() || w.shared) {
      const auto number_text = [](float value) {
        char text[32];
        std::snprintf(text, sizeof text, "%g", static_cast<double>(value));
        return std::string(text);
      };
      std::string experts;
      if (!layer.swiglu.is_default()) {
        experts += "SwiGLU clamped at " + number_text(layer.swiglu.limit) + ", sigmoid(" + number_text(layer.swiglu.alpha) +
                   " x gate), (up + " + number_text(layer.swiglu.up_offset) + ")";
      }
      if (w.has_biases()) experts += std::string(experts.empty() ? "" : "; ") + "biases";
      if (w.shared) {
        experts += std::string(experts.empty() ? "" : "; ") + "a shared expert of ffn " + std::to_string(w.shared->ffn.ffn_hidden) +
                   (w.shared->gate.empty() ? "" : ", gated");
      }
      std::printf("experts: %s\n", experts.c_str());
    }
    std::printf("%-12s %10s %9s %9s %9s %14s %14s %8s\n", "strategy", "wall ms", "compute%", "comm%", "overlap%",
                "max|err| dense", "rel err fp64", "bitwise");
    for (const StrategyResult& r : results) {
      std::printf("%-12s %10.2f %9.1f %9.1f %9.1f %14.3g %14.2e %8s\n", std::string(strategy_name(r.strategy)).c_str(),
                  r.stats.wall_ms, 100.0 * r.stats.compute_busy, 100.0 * r.stats.comm_busy, 100.0 * r.stats.overlap,
                  r.vs_dense.max_abs, r.vs_fp64.relative_frobenius, r.bitwise ? "yes" : "NO");
    }
    fp64.print_sample_note("rel err fp64");
  }

  bool all_bitwise = true;
  for (const StrategyResult& r : results) all_bitwise = all_bitwise && r.bitwise;
  if (all_bitwise && !all_equal) {
    // Every strategy computed what the reference computed: finite inputs and weights (the
    // loaders refuse others) whose products overflow fp32. The data's fault, not tilemoe's.
    throw_bad_input("every strategy equals the dense reference bit for bit, but the output holds NaN or Inf: the inputs or "
                    "weights are too large and overflow fp32 in the expert FFN; scale them down. Nothing written to --output "
                    "or --trace");
  }
  if (!all_equal) {
    std::fprintf(stderr, "tilemoe: a strategy's output differs from the dense reference; nothing written to --output or --trace\n");
    return 1;
  }
  // Both files are staged (written whole under temporary names) before either is renamed into
  // place, so that a failure to write one leaves neither.
  std::vector<StagedFile> staged;
  if (!options.output_path.empty()) staged.push_back(stage_step_output(options.output_path, results.front().run.outputs));
  if (!options.trace_path.empty()) {
    std::vector<TracedStep> traced;
    for (const StrategyResult& r : results) traced.push_back({std::string(strategy_name(r.strategy)), &r.plans, &r.run.records});
    staged.push_back(stage_trace(options.trace_path, traced));
  }
  for (StagedFile& file : staged) file.commit();
  if (!options.trace_path.empty() && !options.json) std::printf("trace: %s (open in https://ui.perfetto.dev)\n", options.trace_path.c_str());
  return 0;
}

}  // namespace

void add_run_command(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<RunOptions>();
  CLI::App* command = app.add_subcommand("run", "run one MoE forward step for each strategy and check it against the references");
  options->step.add_to(*command);
  command->add_option("--backend", options->backend, "cpu, or cuda (in a cuda-preset build; several ranks run as virtual ranks on one GPU)")
      ->capture_default_str();
  command->add_option("--transport", options->transport,
                      "cuda, several ranks: virtual (all ranks on this GPU) or nccl (one process per rank: tilemoe launch, mpirun, srun)")
      ->capture_default_str();
  command->add_option("--dispatch", options->dispatch, "cuda, several ranks: device (device-API kernels) or host (host-API all-to-all)")
      ->capture_default_str();
  command->add_option("--sms-per-rank", options->sms_per_rank,
                      "cuda, virtual ranks: each rank on its own partition of this many SMs (green contexts; 0 = share the GPU)")
      ->capture_default_str();
  command->add_option("--link-gbps", options->link_gbps, "cuda, virtual ranks: emulated outgoing link of each rank, GB/s (0 = unpaced)")
      ->capture_default_str();
  command->add_option("--strategy", options->strategy,
                      "all, sequential, tile_signal or comet (CPU); sequential (= all), tile_signal, comet or auto (cuda)")
      ->capture_default_str();
  command->add_option("--output", options->output_path, "write the output [T, hidden] as safetensors ('output')");
  command->add_option("--trace", options->trace_path, "write a Chrome/Perfetto trace-event JSON of every strategy's step");
  command->add_flag("--json", options->json, "print the result as JSON instead of the table");
  command->add_option("--timeout-ms", options->timeout_ms, "bound of every wait")->capture_default_str();
  command->add_option("--reference-work", options->reference_work,
                      "multiply-adds the fp64 reference (and with --backend cuda the CPU oracle) may spend; past it they check "
                      "evenly spaced tokens of every rank")
      ->capture_default_str();
  command->add_option("--silent-rank", options->silent_rank,
                      "cuda, several ranks, fault injection: this rank's exchange sends nothing, so every rank's step must fail "
                      "within --timeout-ms with an error naming it (-1 = none)")
      ->capture_default_str();
  command->add_option("--link-mbps", options->link_mbps, "emulated outgoing link of each rank, MB/s (0 = unlimited)")->capture_default_str();
  command->add_option("--delay-us", options->delay_us, "random delay of up to this before each task (timing shake)")->capture_default_str();
  command->callback([options, &exit_code] { exit_code = run(*options); });
}

}  // namespace tilemoe::cli
