// tilemoe bench: times a step. CPU backend: every chosen strategy on the CPU engine (wall
// clock, median). CUDA backend: the one-GPU forward per stage (CUDA events, median), weights
// drawn on the device. The full roofline benchmark with its baselines is cuda_layer_bench.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "step_options.hpp"
#include "tilemoe/cpu_executor.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/median.hpp"
#ifdef TILEMOE_WITH_CUDA
#include "cuda_step.hpp"
#endif

namespace tilemoe::cli {

namespace {

struct BenchOptions {
  StepOptions step;
  std::string backend = "cpu";
  std::string strategy = "all";
  int runs = 5;
  bool json = false;
};

double expert_flops(const EpWorld& world) {
  const MoeConfig& l = world.layer;
  const double rows = static_cast<double>(world.total_tokens() * l.top_k);
  const double gemm0_n = l.activation == Activation::SwiGLU ? 2.0 * l.ffn_hidden : l.ffn_hidden;
  return 2.0 * rows * l.hidden * gemm0_n + 2.0 * rows * l.ffn_hidden * l.hidden;
}

int bench_cpu(const BenchOptions& options) {
  const PreparedStep step = prepare_step(options.step);
  std::vector<Strategy> strategies = {Strategy::Sequential, Strategy::TileSignal, Strategy::Comet};
  if (options.strategy != "all") strategies = {parse_strategy(options.strategy)};
  nlohmann::json doc = {{"backend", "cpu"}, {"runs", options.runs}};
  if (!options.json) std::printf("%-12s %10s %10s %10s\n", "strategy", "median ms", "min ms", "GFLOP/s");
  for (Strategy strategy : strategies) {
    const auto plans = compile_plan(strategy, step.world, step.routing, options.step.plan);
    validate_plan(plans);
    std::vector<double> ms;
    for (int run = 0; run < options.runs + 1; ++run) {  // the first is the warm-up
      const StepRun result = run_step(plans, step.weights, step.inputs);
      if (run > 0) ms.push_back(static_cast<double>(result.wall_ns) / 1e6);
    }
    const double med = median(ms);
    const double gflops = expert_flops(step.world) / (med * 1e-3) / 1e9;
    if (options.json) {
      doc["results"].push_back({{"strategy", strategy_name(strategy)}, {"median_ms", med},
                                {"min_ms", *std::min_element(ms.begin(), ms.end())}, {"gflops", gflops}});
    } else {
      std::printf("%-12s %10.2f %10.2f %10.1f\n", std::string(strategy_name(strategy)).c_str(), med,
                  *std::min_element(ms.begin(), ms.end()), gflops);
    }
  }
  if (options.json) std::printf("%s\n", doc.dump(2).c_str());
  return 0;
}

int bench_cuda(const BenchOptions& options) {
#ifdef TILEMOE_WITH_CUDA
  if (!options.step.inputs_path.empty() || !options.step.weights_path.empty()) {
    throw_bad_input("tilemoe bench uses synthetic data; drop --inputs/--weights (tilemoe run takes them)");
  }
  const EpWorld world = world_from_options(options.step);
  const CudaBenchResult r = run_cuda_bench(world, parse_routing_pattern(options.step.routing), options.step.seed, options.runs);
  const double tflops = expert_flops(world) / (r.total_ms * 1e-3) / 1e12;
  if (options.json) {
    nlohmann::json doc = {{"backend", "cuda"}, {"runs", options.runs}, {"total_ms", r.total_ms}, {"tflops", tflops}};
    for (int s = 0; s < 7; ++s) doc["stages_ms"][r.stage_names[s]] = r.stage_ms[s];
    std::printf("%s\n", doc.dump(2).c_str());
  } else {
    for (int s = 0; s < 7; ++s) std::printf("%-10s %9.3f ms\n", r.stage_names[s], r.stage_ms[s]);
    std::printf("%-10s %9.3f ms  (%.0f TFLOP/s over the expert GEMMs' FLOPs; median of %d)\n", "total", r.total_ms, tflops,
                options.runs);
  }
  return 0;
#else
  (void)options;
  throw_bad_input("this build has no CUDA backend: build the cuda preset (make run PRESET=cuda) or use --backend cpu");
#endif
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* command = app.add_subcommand("bench", "time a MoE step: CPU strategies, or the one-GPU layer per stage");
  options->step.add_to(*command);
  command->add_option("--backend", options->backend, "cpu or cuda")->capture_default_str();
  command->add_option("--strategy", options->strategy, "cpu: all, sequential, tile_signal or comet")->capture_default_str();
  command->add_option("--runs", options->runs, "timed runs after one warm-up (median reported)")->capture_default_str();
  command->add_flag("--json", options->json, "print JSON instead of a table");
  command->callback([options, &exit_code] {
    if (options->runs < 1) throw_bad_input("--runs must be at least 1");
    if (options->backend == "cpu") {
      exit_code = bench_cpu(*options);
    } else if (options->backend == "cuda") {
      exit_code = bench_cuda(*options);
    } else {
      throw_bad_input("unknown backend '" + options->backend + "': use cpu or cuda");
    }
  });
}

}  // namespace tilemoe::cli
