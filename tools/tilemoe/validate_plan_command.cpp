// tilemoe validate-plan: compiles the plans of a step, prints a summary per rank and the
// plan checker's verdict.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "commands.hpp"
#include "step_options.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cli {

namespace {

struct ValidateOptions {
  StepOptions step;
  std::string strategy = "all";
};

int validate_plans(const ValidateOptions& options) {
  StepOptions step_options = options.step;
  step_options.plans_only = true;
  const PreparedStep step = prepare_step(step_options);
  std::vector<Strategy> strategies = {Strategy::Sequential, Strategy::TileSignal, Strategy::Comet};
  if (options.strategy != "all") strategies = {parse_strategy(options.strategy)};
  int failures = 0;
  for (Strategy strategy : strategies) {
    const std::vector<StepPlan> plans = compile_plan(strategy, step.world, step.routing, options.step.plan);
    std::printf("%s:\n", std::string(strategy_name(strategy)).c_str());
    std::size_t tasks = 0, flags = 0, bytes = 0;
    LinkTraffic total, most;  // over the ranks, and the busiest rank's of each phase
    for (const StepPlan& plan : plans) {
      std::printf("  %s\n", plan_summary(plan).c_str());
      tasks += plan.task_count();
      flags += plan.flag_count;
      bytes += pack_plan(plan).size();
      const LinkTraffic t = link_traffic(plan);
      total.dispatch_bytes += t.dispatch_bytes;
      total.combine_bytes += t.combine_bytes;
      most.dispatch_bytes = std::max(most.dispatch_bytes, t.dispatch_bytes);
      most.combine_bytes = std::max(most.combine_bytes, t.combine_bytes);
    }
    const double ranks = static_cast<double>(plans.size()), mb = 1e6;
    std::printf("  link bytes sent per rank (dispatch %s): dispatch %.3f MB (most %.3f), combine %.3f MB (most %.3f)\n",
                std::string(dispatch_volume_name(options.step.plan.dispatch)).c_str(), static_cast<double>(total.dispatch_bytes) / ranks / mb,
                static_cast<double>(most.dispatch_bytes) / mb, static_cast<double>(total.combine_bytes) / ranks / mb,
                static_cast<double>(most.combine_bytes) / mb);
    try {
      validate_plan(plans);
      std::printf("  verdict: ok (%zu tasks, %zu flags, %zu plan bytes over %zu ranks)\n", tasks, flags, bytes, plans.size());
    } catch (const Error& error) {
      std::printf("  verdict: INVALID: %s\n", error.what());
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

void add_validate_plan_command(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<ValidateOptions>();
  CLI::App* command = app.add_subcommand("validate-plan", "compile a step's plans, summarise them and check them");
  options->step.add_to(*command);
  command->add_option("--strategy", options->strategy, "all, sequential, tile_signal or comet")->capture_default_str();
  command->callback([options, &exit_code] { exit_code = validate_plans(*options); });
}

}  // namespace tilemoe::cli
