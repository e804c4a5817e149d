#pragma once
// The oracle every GPU test holds a case's outputs to: the CPU executor running a plan of the
// same routing (the routing the GPU chose) and the fp64 reference without intermediate
// rounding, each within the case's tolerance. Past a work bound both run on evenly spaced tokens
// of every rank (include/tilemoe/token_sample.hpp: tokens are independent, so the sub-step's
// outputs are the whole step's rows), so that a benchmark's shape can be checked in minutes.
#include <string>
#include <vector>

#include "moe_cases.hpp"
#include "tilemoe/plan.hpp"
#include "tilemoe/reference.hpp"
#include "tilemoe/tensor.hpp"
#include "tilemoe/token_sample.hpp"
#include "tilemoe/weights.hpp"

namespace tilemoe::cases {

// Multiply-adds the oracle's references may spend (a few seconds on the device machine's host).
constexpr double kOracleWork = 1.6e10;

struct OracleErrors {
  ErrorStats vs_cpu;       // the GPU against the CPU executor running the plans
  ErrorStats vs_fp64;      // the GPU against fp64
  ErrorStats cpu_vs_fp64;  // the CPU executor against fp64, for scale
  std::int64_t tokens_checked = 0, tokens = 0;
  double tolerance = kBf16Tolerance;
  bool within_tolerance() const;
  std::string describe() const;  // the errors, and the sample when it was one
};

// The GPU's outputs of a step against the CPU executor running `strategy`'s plans (with
// `options`) and fp64, on a token sample past `max_work`.
OracleErrors oracle_errors(const EpWorld& world, const std::vector<Matrix>& inputs, const std::vector<Routing>& routing,
                           const ExpertWeights& weights, const std::vector<Matrix>& gpu_outputs, double tolerance,
                           Strategy strategy = Strategy::Sequential, const PlanOptions& options = {},
                           double max_work = kOracleWork);

// The same with the whole step's plans given (a schedule the GPU ran, checked as it is): every token.
OracleErrors oracle_errors_of_plans(const EpWorld& world, const std::vector<Matrix>& inputs, const std::vector<Routing>& routing,
                                    const ExpertWeights& weights, const std::vector<StepPlan>& plans,
                                    const std::vector<Matrix>& gpu_outputs, double tolerance);

}  // namespace tilemoe::cases
