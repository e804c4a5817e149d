#include "split_model.hpp"

#include <algorithm>
#include <cmath>

#include "tilemoe/error.hpp"

namespace tilemoe {

namespace {

double consumer_seconds(const SplitProblem& p, const GpuRates& r, int ctas) {
  double rate = ctas * r.copy_bytes_per_cta;
  if (p.link_bytes_per_s > 0.0) rate = std::min(rate, p.link_bytes_per_s);
  return p.remote_bytes / rate;
}

// GEMM1 on `sms` SMs: its persistent 2-CTA clusters take the tiles in rounds, so a split that
// leaves the tiles one round more costs a whole round (measured: 512 Mixtral tiles on 15
// clusters of a 32-SM partition take 35 rounds where 16 clusters take 32, +9%).
double gemm_seconds(const SplitProblem& p, const GpuRates& r, int sms) {
  const double even = p.gemm1_flops / (r.gemm_flops_per_sm * sms);
  if (p.column_tiles <= 0) return even;
  const double items = static_cast<double>(p.bands) * p.column_tiles / 2.0;
  const int clusters = std::max(1, sms / 2);
  const double rounds = std::ceil(items / clusters);
  return even * rounds / (items / clusters);
}

}  // namespace

SplitChoice choose_split(const SplitProblem& problem, const GpuRates& rates, int min_ctas, int max_ctas, double margin,
                         int ctas_step) {
  if (rates.gemm_flops_per_sm <= 0.0 || rates.copy_bytes_per_cta <= 0.0) {
    throw_bad_input("SM split: the calibrated rates must be positive");
  }
  if (problem.sms < 3 || problem.gemm1_flops < 0.0 || problem.remote_bytes < 0.0 || problem.bands < 1) {
    throw_bad_input("SM split: a problem needs >= 3 SMs, non-negative work and at least one band");
  }
  if (min_ctas < 1 || max_ctas < min_ctas || ctas_step < 1) throw_bad_input("SM split: bad range of consumer CTAs");
  SplitChoice best;
  const double gemm_all = gemm_seconds(problem, rates, problem.sms);
  best.sequential_ms = 1e3 * (gemm_all + consumer_seconds(problem, rates, problem.sms));
  best.predicted_ms = best.sequential_ms;
  const int top = std::min(max_ctas, problem.sms - 2);
  double least = 0.0;
  for (int c = min_ctas; c <= top; c += ctas_step) {
    const double gemm = gemm_seconds(problem, rates, problem.sms - c);
    const double comm = consumer_seconds(problem, rates, c);
    const double ms = 1e3 * (std::max(gemm, comm) + comm / problem.bands);
    if (best.best_ctas == 0 || ms < least) {
      best.best_ctas = c;
      least = ms;
    }
    if (ms < best.predicted_ms * (best.overlap ? 1.0 : 1.0 - margin)) {
      best.overlap = true;
      best.consumer_ctas = c;
      best.predicted_ms = ms;
    }
  }
  return best;
}

}  // namespace tilemoe
