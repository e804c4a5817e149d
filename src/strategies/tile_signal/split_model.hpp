#pragma once
// How many SMs the tile-signal consumer gets: a small cost model of one expert-parallel step's
// GEMM1 + combine, from two rates calibrated once per GPU (and cached in a file).
//
//   GEMM1 on S - c SMs:    Tg(c) = flops / (gemm_rate_per_sm * (S - c)), stretched to whole
//                          rounds of its (S - c) / 2 clusters over the tiles (column_tiles > 0)
//   consumer on c CTAs:    Tc(c) = remote bytes / min(c * copy_rate_per_cta, link)
//   overlapped:            T(c)  = max(Tg(c), Tc(c)) + Tc(c) / bands     (the last band ships alone)
//   sequential:            Ts    = Tg(0) + remote bytes / min(S * copy_rate_per_cta, link)
//
// The choice is the c in [min, max] with the least T(c); if even that is not below Ts by a
// margin, the choice is the sequential strategy (the paper's data: 2 SMs of 108 can lose to
// no overlap at all, so a split is taken only where the model sees it win).
#include "tilemoe/gpu_rates.hpp"

namespace tilemoe {

struct SplitProblem {
  double gemm1_flops = 0.0;   // this rank's GEMM1
  double remote_bytes = 0.0;  // rows it ships to other ranks
  double link_bytes_per_s = 0.0;  // the rank's outgoing link; 0 = not the limit
  int bands = 1;              // row bands of GEMM1 (the pipelining grain)
  int column_tiles = 0;       // GEMM1's column tiles per band; > 0: its time counts whole rounds
                              // of its 2-CTA clusters over bands x column_tiles / 2 items
  int sms = 0;                // SMs the rank's kernels run on
};

struct SplitChoice {
  bool overlap = false;       // false: run sequential
  int consumer_ctas = 0;      // the winning split (overlap only)
  int best_ctas = 0;          // the least T(c) in the range, winning or not
  double predicted_ms = 0.0;  // of the choice
  double sequential_ms = 0.0;
};

// Bad input for rates or a problem that make no sense (non-positive rates, too few SMs).
// Candidates are min_ctas, min_ctas + ctas_step, ... up to max_ctas.
SplitChoice choose_split(const SplitProblem& problem, const GpuRates& rates, int min_ctas = 2, int max_ctas = 32,
                         double margin = 0.03, int ctas_step = 1);

}  // namespace tilemoe
