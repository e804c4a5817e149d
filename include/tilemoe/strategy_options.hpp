#pragma once
// The knobs of each strategy, one struct per published system, shared by every backend: the CPU
// engine's plan compiler (PlanOptions) and the GPU layer (cuda::EpMoeLayerOptions) read the same
// fields. 0 means "the strategy chooses" (its defaults and cost model live with it, in
// src/strategies/<system>/).
#include <cstdint>

namespace tilemoe {

// tile_signal (ICPP 2026): GEMM1 raises a flag per row band; a consumer ships ready bands.
struct TileSignalOptions {
  // Row bands the consumer waits for and ships as one segment (the paper's mgb). 0: the
  // strategy's choice, 2 on the CPU engine (a segment is a task with its own overhead there),
  // 1 on the GPU. At most 8 on the CPU, 32 on the GPU.
  int bands_per_segment = 0;
  // GPU: the consumer's CTAs (even: clusters of 2, like GEMM1's); GEMM1 leaves as many SMs free.
  // 0: the cost model's best split for the layer's shape (split_model.hpp).
  int consumer_ctas = 0;
  // GEMM1 computes each expert's bands in blocks of this many (even; all column tiles of a block
  // before the next block), so that bands become ready one block at a time. 0: on the GPU about
  // two waves of GEMM1's clusters per block, on the CPU engine one block per expert.
  int band_block = 0;
};

// comet (MLSys 2025): layer 1 in column splits, each shipped and reduced as it completes.
struct CometOptions {
  std::int64_t split_cols = 0;  // T_N, hidden columns per layer-1 split; 0 = hidden / 4
  // GPU: the CTAs of the exchange beside each GEMM, each taking an SM from it; 0 = the cost
  // model's choice for the layer's shape. The dispatch's first CTA sends, the others place what
  // lands; the splits' sends share the other ranks among theirs.
  int dispatch_ctas = 0;
  int send_ctas = 0;
};

}  // namespace tilemoe
