#pragma once
// comet's decisions for one rank's layer on the GPU, taken once when the layer is built: the
// column split of layer 1 and the CTAs of the exchange that runs beside each GEMM (the dispatch
// beside GEMM0, the splits' sends beside GEMM1), with the SMs they leave the GEMMs. The layer asks
// and obeys.
#include <cstdint>
#include <functional>
#include <string>

#include "tilemoe/gpu_rates.hpp"
#include "tilemoe/strategy_options.hpp"

namespace tilemoe::cuda {

// What the layer knows of the rank's step and GPU.
struct CometGpuShape {
  std::int64_t tokens = 0;     // the most tokens a rank forwards per step
  std::int64_t hidden = 0, ffn_hidden = 0, experts = 0, top_k = 1;
  int world = 2;
  bool once_per_rank = true;   // the dispatch's volume: a token once per destination rank, or a row per expert
  int sm_count = 0;            // SMs the rank's kernels run on
  int sharing = 1;             // ranks sharing those SMs (virtual ranks)
  int sequential_ctas_per_peer = 1;  // the exchange's where it runs alone (the sequential strategy's: the model's baseline)
  double link_bytes_per_s = 0.0;     // the rank's outgoing link; 0 = not the limit
};

struct CometGpuSchedule {
  std::int64_t split_cols = 0;  // GEMM1 columns per split: a multiple of the planned GEMM's 256-column tile
  // The exchange's CTAs beside each GEMM (SegmentCopyArgs::packed_ctas), and the SMs each GEMM
  // may use: an exchange CTA keeps a GEMM off its SM (a GEMM CTA takes the SM's whole register
  // file), and the block scheduler spreads a grid over idle SMs before it stacks CTAs on one, so
  // each exchange CTA may sit on an SM of its own: a GEMM leaves one SM per CTA beside it. Were the
  // GEMMs given more, a grid of waiting sends spread over every SM could keep GEMM1, which they
  // wait for, from starting at all.
  int dispatch_ctas = 1, send_ctas = 1;
  int gemm0_sm_limit = 0, gemm1_sm_limit = 0;
  // The dispatch sends to one rank after another in the ring's order, each with the whole link
  // (SegmentCopyArgs::serial_sends), so that a rank's sources land one after another, r + 1's
  // first, and GEMM0 works through them as they come; sent all at once, every source's rows land
  // at the dispatch's end and GEMM0 could start only on the rank's own.
  bool serial_sends = true;
  double predicted_ms = 0.0, sequential_ms = 0.0;  // the cost model's (cost_model.hpp) for this shape
  std::string note;             // for the layer's description
};

// GEMM1's columns per split: the option's, which must be a positive multiple of 256 columns (a
// GEMM1 tile never straddles two splits; bad input otherwise), or by default a quarter of hidden
// in whole pairs of tiles (512 columns: the 1x2 pairs then have no padding mates).
std::int64_t comet_gpu_split_cols(std::int64_t hidden, const CometOptions& options);

// The schedule: the options' split and CTAs, or those the cost model finds fastest for the
// shape on `rates` (which may calibrate the GPU; empty: no model, two CTAs beside each GEMM).
// Bad input, saying what to change, for a bad split, negative CTAs, or SMs too few to run the
// GEMMs beside the exchange.
CometGpuSchedule comet_gpu_schedule(const CometGpuShape& shape, const CometOptions& options,
                                    const std::function<const GpuRates&()>& rates = {});

}  // namespace tilemoe::cuda
