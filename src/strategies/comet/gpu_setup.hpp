#pragma once
// comet's decisions for one rank's layer on the GPU, taken once when the layer is built: the
// column split of layer 1 and the SMs the GEMMs leave to the exchange that runs beside them (the
// dispatch beside GEMM0, the splits' sends beside GEMM1). The layer asks and obeys.
#include <cstdint>
#include <string>

#include "tilemoe/strategy_options.hpp"

namespace tilemoe::cuda {

// What the layer knows of the rank's step and GPU.
struct CometGpuShape {
  std::int64_t hidden = 0;
  int sm_count = 0;            // SMs the rank's kernels run on
  int sharing = 1;             // ranks sharing those SMs (virtual ranks)
  int dispatch_ctas = 0;       // the dispatch grid's CTAs (the exchange's CTAs per peer x ranks)
  int dispatch_ctas_per_sm = 1;  // of them, resident on one SM
};

struct CometGpuSchedule {
  std::int64_t split_cols = 0;  // GEMM1 columns per split: a multiple of the planned GEMM's 256-column tile
  int gemm_sm_limit = 0;        // SMs each GEMM may use; the others run the exchange beside it
  // The dispatch sends to one rank after another in the ring's order, each with the whole link
  // (SegmentCopyArgs::serial_sends), so that a rank's sources land one after another, r + 1's
  // first, and GEMM0 works through them as they come; sent all at once, every source's rows land
  // at the dispatch's end and GEMM0 could start only on the rank's own.
  bool serial_sends = true;
  std::string note;             // for the layer's description
};

// The exchange's CTAs per peer where the user leaves them to the layer: the dispatch runs beside
// GEMM0 and takes SMs from it, so it gets about an eighth of the rank's share of the SMs, at
// least one CTA per peer (the other strategies' exchange runs alone and takes up to half).
int comet_exchange_ctas_per_peer(int sm_count, int sharing, int resident_ctas_per_sm, int world);

// GEMM1's columns per split: the option's, which must be a positive multiple of 256 columns (a
// GEMM1 tile never straddles two splits; bad input otherwise), or by default a quarter of hidden
// in whole pairs of tiles (512 columns: the 1x2 pairs then have no padding mates).
std::int64_t comet_gpu_split_cols(std::int64_t hidden, const CometOptions& options);

// Bad input, saying what to change, for a bad split (above) or SMs too few to run the GEMMs beside
// the exchange.
CometGpuSchedule comet_gpu_schedule(const CometGpuShape& shape, const CometOptions& options);

}  // namespace tilemoe::cuda
