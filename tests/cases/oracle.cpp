#include "oracle.hpp"

#include <cstdio>

#include "tilemoe/cpu_executor.hpp"

namespace tilemoe::cases {

bool OracleErrors::within_tolerance() const {
  return vs_fp64.finite && vs_cpu.finite && vs_fp64.relative_frobenius < tolerance && vs_cpu.relative_frobenius < tolerance;
}

std::string OracleErrors::describe() const {
  char text[240];
  std::snprintf(text, sizeof text, "rel. Frobenius error vs fp64 %.2e (CPU executor: %.2e), vs the CPU executor %.2e", vs_fp64.relative_frobenius,
                cpu_vs_fp64.relative_frobenius, vs_cpu.relative_frobenius);
  std::string out = text;
  if (tokens_checked != tokens) out += " (on " + std::to_string(tokens_checked) + " of " + std::to_string(tokens) + " tokens)";
  return out;
}

namespace {

OracleErrors errors_of(const EpWorld& world, const std::vector<Matrix>& inputs, const std::vector<Routing>& routing,
                       const ExpertWeights& weights, const std::vector<StepPlan>& plans, const std::vector<Matrix>& gpu_outputs,
                       double tolerance) {
  const StepRun cpu = run_step(plans, weights, inputs);
  const auto fp64 = fp64_reference(world, inputs, routing, weights);
  OracleErrors e;
  e.vs_cpu = compare(gpu_outputs, cpu.outputs);
  e.vs_fp64 = compare(gpu_outputs, fp64);
  e.cpu_vs_fp64 = compare(cpu.outputs, fp64);
  e.tokens_checked = e.tokens = world.total_tokens();
  e.tolerance = tolerance;
  return e;
}

}  // namespace

OracleErrors oracle_errors(const EpWorld& world, const std::vector<Matrix>& inputs, const std::vector<Routing>& routing,
                           const ExpertWeights& weights, const std::vector<Matrix>& gpu_outputs, double tolerance,
                           Strategy strategy, const PlanOptions& options, double max_work) {
  const TokenSample sample = sample_tokens(world, routing, max_work);
  const SampledStep sub = sampled_step(sample, world, inputs, routing);
  const auto plans = compile_plan(strategy, sub.world, sub.routing, options);
  OracleErrors e = errors_of(sub.world, sub.inputs, sub.routing, weights, plans, sampled_rows(sample, gpu_outputs), tolerance);
  e.tokens = sample.total;
  return e;
}

OracleErrors oracle_errors_of_plans(const EpWorld& world, const std::vector<Matrix>& inputs, const std::vector<Routing>& routing,
                                    const ExpertWeights& weights, const std::vector<StepPlan>& plans,
                                    const std::vector<Matrix>& gpu_outputs, double tolerance) {
  return errors_of(world, inputs, routing, weights, plans, gpu_outputs, tolerance);
}

}  // namespace tilemoe::cases
