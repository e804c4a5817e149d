#pragma once
// The sequential strategy's decisions for a layer on the GPU that every strategy builds on: all
// of them dispatch through the same exchange kernels and run GEMM0 in the same order.
namespace tilemoe::cuda {

// What the layer knows of where the rank's exchange kernels run.
struct ExchangeShape {
  int world = 1;
  int sm_count = 0;                // SMs of the rank's GPU (or partition)
  int sharing = 1;                 // ranks sharing those SMs
  int resident_ctas_per_sm = 0;    // exchange CTAs one SM holds at once
};

// CTAs of the exchange kernels per destination rank: `requested` (> 0) if it fits, else 0 picks.
// Every rank's exchange kernels on these SMs wait for each other, so all of them must be
// resident at once; bad input, saying the most that fits, when they cannot be.
int choose_exchange_ctas_per_peer(const ExchangeShape& shape, int requested);

// GEMM0's table in blocks of 16 bands: measured 1-2.5% faster than the whole group at once at
// Mixtral 16384 tokens (32 bands per expert; BENCHMARKS.md, 2026-12-03), where the card runs at
// its power limit and less L2 traffic per FLOP buys clock; no effect on experts of <= 16 bands.
constexpr int kGemm0BandBlock = 16;

}  // namespace tilemoe::cuda
