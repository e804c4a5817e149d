// tilemoe validate-plan: compiles the plans of a step, prints a summary per rank and the
// plan checker's verdict.
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
  const PreparedStep step = prepare_step(options.step);
  std::vector<Strategy> strategies = {Strategy::Sequential, Strategy::TileSignal, Strategy::Comet};
  if (options.strategy != "all") strategies = {parse_strategy(options.strategy)};
  int failures = 0;
  for (Strategy strategy : strategies) {
    const std::vector<StepPlan> plans = compile_plan(strategy, step.world, step.routing, options.step.plan);
    std::printf("%s:\n", std::string(strategy_name(strategy)).c_str());
    std::size_t tasks = 0, flags = 0, bytes = 0;
    for (const StepPlan& plan : plans) {
      std::printf("  %s\n", plan_summary(plan).c_str());
      tasks += plan.task_count();
      flags += plan.flag_count;
      bytes += pack_plan(plan).size();
    }
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
