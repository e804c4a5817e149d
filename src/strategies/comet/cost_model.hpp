#pragma once
// comet's cost model: one expert-parallel step's two GEMMs and two exchanges, sequential and
// overlapped as comet overlaps them, from the rates calibrated once per GPU (gpu_rates.hpp). The
// schedule (gpu_setup.hpp) sizes comet's exchange by it; the layer prints both times in its
// description, so that a benchmark shows the model beside the clock.
//
//   GEMMs on s SMs:     G0(s), G1(s) = flops / (gemm_flops_per_sm * s)
//   a copy on n CTAs:   bytes / min(link, n * copy rate)   (the link only for bytes to other ranks)
//   sequential:         G0(S) + G1(S) + D + C             (its exchange alone, wide CTAs)
//   comet, layer 0:     the dispatch on dispatch_ctas CTAs beside GEMM0 on the SMs they leave, a
//                       source at a time in ring order (this rank's own first), each a W-th of
//                       the work: the own rows are copied first (P' each: a source's local copy
//                       on one CTA); one CTA sends to one rank after another, so source i lands
//                       at i D' / (W - 1) (one CTA for all: after its own rows); with a dispatch
//                       once per rank the other CTAs place the sources dealt round-robin as they
//                       land (one CTA for all: after its last send), else the rows land in place;
//                       GEMM0 takes a source once it is in place and GEMM0 is done with the one
//                       before, G0' / W each. Layer 0 ends with the last source's GEMM0.
//   comet, layer 1:     GEMM1 in splits beside the splits' sends on send_ctas CTAs (C'); the last
//                       split ships after GEMM1, the first is GEMM'd before anything ships:
//                         max(G1' + C' / splits, C' + G1' / splits)
// What runs the same way in both (the plan's compile, the routing, the combine kernel) is left out
// of both; the placements too, but for comet's few CTAs placing beside GEMM0 (sequential's
// exchange places on its whole grid, a small part of its step).
#include "tilemoe/gpu_rates.hpp"

namespace tilemoe {

struct CometCostProblem {
  double gemm0_flops = 0.0, gemm1_flops = 0.0;      // this rank's
  double dispatch_bytes = 0.0, combine_bytes = 0.0;  // what it sends to other ranks in each exchange
  double local_bytes_per_source = 0.0;               // a source's rows as copied locally (its own rows, a placement)
  bool places_arrivals = true;                       // a dispatch once per rank: what lands is placed; else it lands in place
  double link_bytes_per_s = 0.0;                     // the rank's outgoing link; 0 = not the limit
  int world = 2;
  int splits = 1;                 // GEMM1's column splits
  int sms = 0;                    // the rank's SMs
  int gemm0_sms = 0, gemm1_sms = 0;  // of them, each GEMM's while comet's exchange runs beside it
  int dispatch_ctas = 1;          // comet's dispatch: one sends, the others place (SegmentCopyArgs::packed_ctas)
  int send_ctas = 1;              // comet's splits' sends, each to its share of the other ranks
  double sequential_ctas = 0.0;   // the sequential exchange's CTAs copying to other ranks at once
};

struct CometCost {
  double comet_ms = 0.0, sequential_ms = 0.0;
  double layer0_ms = 0.0, layer1_ms = 0.0;  // comet's two terms (above)
};

// Bad input for rates or a problem that make no sense (non-positive rates, no SMs, splits < 1).
CometCost comet_cost(const CometCostProblem& problem, const GpuRates& rates);

}  // namespace tilemoe
