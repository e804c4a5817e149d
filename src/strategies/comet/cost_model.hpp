#pragma once
// comet's cost model: one expert-parallel step's two GEMMs and two exchanges, sequential and
// overlapped as comet overlaps them, from the rates calibrated once per GPU (gpu_rates.hpp). The
// layer prints both in its description, so that a benchmark shows the model beside the clock;
// `auto` does not pick comet by it yet (NOTES.md: not yet checked against a measurement).
//
//   GEMMs on s SMs:     G0(s), G1(s) = flops / (gemm_flops_per_sm * s)
//   an exchange:        bytes / min(link, its CTAs' copy rate)
//   sequential:         G0(S) + G1(S) + D + C                    (its exchange alone, wide CTAs)
//   comet:              max(G0', D' + G0' / W)                   (GEMM0 beside the dispatch: the
//                                                                 last source's rows are GEMM'd
//                                                                 after they land)
//                     + max(G1' + C' / splits, C' + G1' / splits) (the last split ships after
//                                                                 GEMM1; the first is GEMM'd before
//                                                                 anything ships)
// where G' are the GEMMs on the SMs the exchange leaves them and D', C' the exchanges on comet's
// CTAs beside them. What runs the same way in both (the plan's compile, the routing, the
// placements of a dispatch once per rank, the combine kernel) is left out of both.
#include "tilemoe/gpu_rates.hpp"

namespace tilemoe {

struct CometCostProblem {
  double gemm0_flops = 0.0, gemm1_flops = 0.0;      // this rank's
  double dispatch_bytes = 0.0, combine_bytes = 0.0;  // what it sends to other ranks in each exchange
  double link_bytes_per_s = 0.0;                     // the rank's outgoing link; 0 = not the limit
  int world = 2;
  int splits = 1;                // GEMM1's column splits
  int sms = 0;                   // the rank's SMs
  int gemm_sms = 0;              // of them, the GEMMs' while comet's exchange runs beside them
  // CTAs copying to other ranks at once (each at the calibrated copy rate): comet's dispatch
  // (one destination at a time), its splits' sends, and the sequential exchange
  double dispatch_ctas = 0.0, combine_ctas = 0.0, sequential_ctas = 0.0;
};

struct CometCost {
  double comet_ms = 0.0, sequential_ms = 0.0;
};

// Bad input for rates or a problem that make no sense (non-positive rates, no SMs, splits < 1).
CometCost comet_cost(const CometCostProblem& problem, const GpuRates& rates);

}  // namespace tilemoe
