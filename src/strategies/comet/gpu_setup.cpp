#include "gpu_setup.hpp"

#include <algorithm>
#include <cstdio>

#include "cost_model.hpp"
#include "plan/gpu_tables.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

std::int64_t comet_gpu_split_cols(std::int64_t hidden, const CometOptions& options) {
  constexpr std::int64_t kPair = 2 * kPlannedTileN;
  if (options.split_cols < 0 || options.split_cols % kPlannedTileN != 0) {
    throw_bad_input("comet on the GPU: split_cols must be 0 (a quarter of hidden) or a positive multiple of " +
                    std::to_string(kPlannedTileN) + " (the GEMM's tile width), not " + std::to_string(options.split_cols));
  }
  const std::int64_t quarter = (hidden + 3) / 4;
  return options.split_cols > 0 ? options.split_cols : std::max(kPair, (quarter + kPair - 1) / kPair * kPair);
}

namespace {

// The most CTAs the model weighs beside a GEMM: past a few, each costs the GEMM more than it gains.
constexpr int kMostExchangeCtas = 4;

// The SMs a rank's GEMM may use beside `ctas` exchange CTAs, in whole 2-SM clusters: ranks sharing
// the SMs split what every rank's exchange leaves, so that all their GEMMs and exchanges are
// resident at once (another rank's spinning GEMM could otherwise keep a rank's dispatch off the GPU,
// and every rank waits for its sends).
int gemm_sms_beside(const CometGpuShape& s, int ctas) {
  const int sharing = std::max(1, s.sharing);
  return (s.sm_count - ctas * sharing) / sharing / 2 * 2;
}

// What the cost model needs of the shape, under balanced routing: each rank receives about
// tokens x top_k expert rows, and a token's top_k distinct experts miss a given rank's L with
// probability C(E - L, k) / C(E, k).
CometCostProblem cost_problem(const CometGpuShape& s, const CometGpuSchedule& schedule, int dispatch_ctas, int send_ctas) {
  const double rows = static_cast<double>(s.tokens * s.top_k), row_bytes = 2.0 * static_cast<double>(s.hidden);
  const double remote = static_cast<double>(s.world - 1) / s.world;
  const std::int64_t local = s.experts / std::max(1, s.world);
  double miss = 1.0;
  for (std::int64_t i = 0; i < s.top_k; ++i) miss *= static_cast<double>(std::max<std::int64_t>(s.experts - local - i, 0)) / (s.experts - i);
  const double dispatch_rows = s.once_per_rank ? static_cast<double>(s.tokens) * s.world * (1.0 - miss) : rows;
  CometCostProblem p;
  p.gemm0_flops = 2.0 * rows * static_cast<double>(s.hidden) * 2.0 * static_cast<double>(s.ffn_hidden);  // gate and up
  p.gemm1_flops = 2.0 * rows * static_cast<double>(s.ffn_hidden) * static_cast<double>(s.hidden);
  p.dispatch_bytes = dispatch_rows * remote * row_bytes;
  p.combine_bytes = rows * remote * row_bytes;
  // a W-th of the rank's rows per source, copied locally: its own rows, and with a dispatch once
  // per rank every source's placement
  p.local_bytes_per_source = rows / s.world * row_bytes;
  p.places_arrivals = s.once_per_rank;
  p.link_bytes_per_s = s.link_bytes_per_s;
  p.world = s.world;
  p.splits = static_cast<int>((s.hidden + schedule.split_cols - 1) / schedule.split_cols);
  p.sms = std::max(1, s.sm_count / std::max(1, s.sharing));  // ranks sharing the SMs share the GEMM rate too
  p.gemm0_sms = std::max(1, std::min(p.sms, gemm_sms_beside(s, dispatch_ctas)));
  p.gemm1_sms = std::max(1, std::min(p.sms, gemm_sms_beside(s, send_ctas)));
  p.dispatch_ctas = dispatch_ctas;
  p.send_ctas = send_ctas;
  p.sequential_ctas = (s.world - 1) * s.sequential_ctas_per_peer;
  return p;
}

// The option's CTAs beside a GEMM, refused where they leave it no cluster; or 0 (the model's).
int checked_ctas(const CometGpuShape& s, int ctas, const char* option) {
  if (ctas < 0) throw_bad_input(std::string("comet: ") + option + " must be 0 (the cost model's) or a positive count of CTAs");
  if (ctas > 0 && gemm_sms_beside(s, ctas) < 2) {
    throw_bad_input(std::string("comet: ") + option + " = " + std::to_string(ctas) + " CTAs x " + std::to_string(std::max(1, s.sharing)) +
                    " rank(s) leave the GEMM beside them less than one 2-SM cluster of the " + std::to_string(s.sm_count) +
                    " SMs: use fewer, or another strategy");
  }
  return ctas;
}

}  // namespace

CometGpuSchedule comet_gpu_schedule(const CometGpuShape& s, const CometOptions& options, const std::function<const GpuRates&()>& rates) {
  CometGpuSchedule schedule;
  schedule.split_cols = comet_gpu_split_cols(s.hidden, options);
  const int dispatch_option = checked_ctas(s, options.dispatch_ctas, "dispatch_ctas");
  const int send_option = checked_ctas(s, options.send_ctas, "send_ctas");
  if (gemm_sms_beside(s, 1) < 2) {
    throw_bad_input("comet: one exchange CTA x " + std::to_string(std::max(1, s.sharing)) +
                    " rank(s) leaves the GEMMs less than one 2-SM cluster of the " + std::to_string(s.sm_count) + " SMs: use another strategy");
  }
  // the largest count that leaves a GEMM a cluster, up to kMostExchangeCtas
  int most = 1;
  while (most < kMostExchangeCtas && gemm_sms_beside(s, most + 1) >= 2) ++most;
  const bool model = rates && s.world > 1 && s.tokens > 0;
  schedule.dispatch_ctas = dispatch_option > 0 ? dispatch_option : std::min(2, most);
  schedule.send_ctas = send_option > 0 ? send_option : std::min({2, most, std::max(1, s.world - 1)});
  if (model) {
    const GpuRates& r = rates();
    // the two layers' terms are independent: each count is the one of least time for its layer,
    // the fewest CTAs among those within 1% of it (an SM left to the GEMMs where the model cannot tell)
    auto best = [&](int option, auto term) {
      if (option > 0) return option;
      int chosen = 1;
      double least = term(1);
      for (int ctas = 2; ctas <= most; ++ctas) {
        const double t = term(ctas);
        if (t < least * 0.99) {
          least = t;
          chosen = ctas;
        }
      }
      return chosen;
    };
    schedule.dispatch_ctas = best(dispatch_option, [&](int n) { return comet_cost(cost_problem(s, schedule, n, 1), r).layer0_ms; });
    schedule.send_ctas = best(send_option, [&](int n) { return comet_cost(cost_problem(s, schedule, 1, n), r).layer1_ms; });
  }
  schedule.gemm0_sm_limit = gemm_sms_beside(s, schedule.dispatch_ctas);
  schedule.gemm1_sm_limit = gemm_sms_beside(s, schedule.send_ctas);
  schedule.note = "GEMM0 on " + std::to_string(schedule.gemm0_sm_limit) + " SMs beside the dispatch's " +
                  std::to_string(schedule.dispatch_ctas) + " CTAs, GEMM1 on " + std::to_string(schedule.gemm1_sm_limit) +
                  " beside the sends' " + std::to_string(schedule.send_ctas) + ", in splits of " + std::to_string(schedule.split_cols) +
                  " columns";
  if (model) {
    const CometCost cost = comet_cost(cost_problem(s, schedule, schedule.dispatch_ctas, schedule.send_ctas), rates());
    schedule.predicted_ms = cost.comet_ms;
    schedule.sequential_ms = cost.sequential_ms;
    char text[96];
    std::snprintf(text, sizeof text, "; model %.3f ms vs sequential %.3f ms", cost.comet_ms, cost.sequential_ms);
    schedule.note += text;
  }
  return schedule;
}

}  // namespace tilemoe::cuda
