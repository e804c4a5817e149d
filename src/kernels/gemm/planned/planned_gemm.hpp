#pragma once
// Planned grouped GEMM: a persistent warp-specialised sm90 bf16 GEMM over the local experts
// whose work is a TILE TABLE (data, not a scheduler), with the activation fused into its
// epilogue and an optional ready flag raised after each tile is stored.
//
// The mainloop (TMA loads, wgmma, the smem pipeline) is CUTLASS's pointer-array collective; the
// kernel around it (which tile each CTA takes, the epilogue, the flags) is ours, because the
// stock pointer-array kernels accept only CUTLASS's own group scheduler.
//
// Problem: D[r][c] = act( sum_k A[r][k] * B_g[n][k] ) for each table entry, where
//   A       row-major [a_rows][K], all groups' rows in one matrix (a group is a row range);
//   B_g     = B + g * N * K, stored [N][K] (the nn.Linear layout);
//   D       row-major [a_rows][n_out] with n_out = N / 2 for SwiGLU (gate/up columns
//           interleaved: column 2f is gate f, 2f+1 is up f), else N;
//   act     none, silu(gate) * up, or gelu (erf form), in fp32, rounded to bf16 once.
// A table entry is one 128 x 256 tile of the GEMM (before the activation halves N): rows
// [row_begin, row_begin + rows) of A and D, GEMM columns [256 * col_tile, 256 * col_tile + 256).
// row_begin need not be a multiple of 128: a plan's row bands map to entries directly.
//
// Order: a cluster of CTAs takes table entries in groups of cluster_size (its "item"). With the
// static fetch, cluster c of C runs items c, c + C, c + 2C, ...; with the dynamic fetch, a
// cluster takes the next unclaimed item from a counter when it starts one, so items still start
// in table order but a cluster that drew cheap items (padding) takes more of them (ItemFetch).
// Mates of one item share one operand by
// TMA multicast, so the table must keep them compatible (check_tile_table): a 2x1 cluster shares
// B (same group and col_tile), a 1x2 cluster shares A (same row_begin). An entry with rows = 0
// computes but stores nothing (padding for a cluster's mate).
//
// Flags: after an entry's tile is stored, one thread adds 1 to flags[flag] with release
// semantics at GPU scope (flag = -1: none). A reader that acquires flags[f] >= expected sees
// every tile counted into it. The GEMM only adds: a caller that reuses flags across runs either
// waits for run_index * tiles_per_flag or resets them between runs (the tile-signal layer
// resets its band flags before each step's GEMM1, as its bands change from step to step).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/cuda/device_transport.hpp"
#include "plan/gpu_tables.hpp"
#include "plan/tile_table.hpp"
#include "tilemoe/plan.hpp"

namespace tilemoe::cuda {

constexpr int kPlannedTileK = 64;        // one pipeline stage's K
constexpr int kPlannedClusterSize = 2;   // both PlannedCluster shapes are pairs of CTAs

enum class PlannedEpilogue { Store, SwiGLU, GELU };
const char* planned_cluster_name(PlannedCluster cluster);  // "c2x1" / "c1x2"

// The table's order and flags: plan/tile_table.hpp (build_tile_table is the host twin of the
// builder below). Sizes: upper bound on the entries for `rows` rows in `groups` groups.
std::int64_t max_tile_entries(std::int64_t rows, int groups, int N, PlannedCluster cluster);

// Writes the sequential table on the device from row_offset [groups + 1] (device), without a
// host sync: entries to `table` (room for `capacity`), their count to *count. More entries than
// capacity (impossible when capacity = max_tile_entries of the rows) writes none and sets
// *count to -1, which the GEMM treats as empty.
void launch_build_tile_table(cudaStream_t stream, const int* row_offset, int groups, int N, PlannedCluster cluster,
                             TileFlags flags, GemmTileEntry* table, int capacity, int* count, int band_block = 0);

// Throws a bad-input tilemoe::Error naming the first entry that breaks a rule: a bad group,
// rows outside 0..128 or outside [0, a_rows), a col_tile outside the N tiles, a flag outside
// [-1, flag_count), a count that is not a multiple of the cluster size, or mates of one item
// that do not share the operand their cluster multicasts.
void check_tile_table(const std::vector<GemmTileEntry>& table, int groups, int a_rows, int N, PlannedCluster cluster,
                      int flag_count);

// Whether a warp group whose 64 rows of a tile are all padding skips its MMAs (it consumes the
// stages without computing, so the other warp group has the tensor cores; the output bits are
// the same either way).
//  Default:       SkipAll. (Until one thread of a skipping warp group took over its waits and
//                 releases, the skip hung about one launch in 2-450 on c2x1 clusters and under
//                 racecheck on c1x2, and c2x1 issued every MMA by default: NOTES.md, 2026-12-04.)
//  Issue:         every warp group issues its MMAs.
//  SkipHalfTiles: only the second warp group of a band of <= 64 rows; a c2x1 cluster's padding
//                 mate (rows = 0) computes on its copy of the partner's rows.
//  SkipAll:       both, and the padding mate's two warp groups.
enum class PaddingMma { Default, Issue, SkipHalfTiles, SkipAll };
const char* padding_mma_name(PaddingMma mode);  // "default", "issue", "skip-half", "skip-all"

// How clusters take items from the table. Either way every item runs exactly once and the output
// bits are the same; only which cluster runs an item, and when, differs.
//  Default: Dynamic where padding MMAs are skipped and K >= 2048, else Static. Measured on the
//           H200 (BENCHMARKS.md, 2026-12-04) on c1x2: with the skip, the dynamic fetch took the
//           balanced DeepSeek-V3 GEMMs from 17.3 to 14.2 ms (16384 tokens, GEMM0) and 3.08 to
//           2.51 ms (4096, GEMM1); where K is short (Qwen3's GEMM1, K 768: 12 K tiles an item)
//           the hand-off costs 2-8%. On c2x1 it gained nothing while c2x1 issued every MMA;
//           c2x1 with the skip (the default since 08d7382) has not been timed with either fetch.
//  Static:  cluster c of C runs items c, c + C, ...: no shared state, but a cluster that draws
//           half-cost items (bands of <= 64 rows, skipped padding MMAs) runs ahead of the
//           others, and the clusters that read one expert's weight slice drift apart.
//  Dynamic: one CTA of each cluster claims items from a device counter (one atomic per item,
//           claimed one item ahead) and hands each to its mates and warps through a ring of
//           slots in shared memory; the items in flight stay a window of the table's order.
enum class ItemFetch { Default, Static, Dynamic };
const char* item_fetch_name(ItemFetch fetch);  // "default", "static", "dynamic"

struct PlannedProbeRecord;  // planned_gemm_probe.hpp

// The waits of a plan's tiles that a kernel running at the same time meets (COMET's GEMM0 runs
// while the dispatch lands its rows: each tile waits for the sources of its rows). Before it
// loads a tile's rows, the loader waits, bounded, for each of the tile's plan waits on a
// counter flag, then orders its TMA loads (the async proxy) after the stores it acquired. A
// stalled wait is recorded in the transport's failure record (naming the rank the wait names)
// and the GEMM goes on without it: the step is failing, and the GEMM still ends. Waits for the
// other flags (the GEMMs' own) are met by stream order.
struct PlannedTileWaits {
  DeviceTransport transport;              // the rank's: its region holds the counters
  std::size_t counters = 0;               // region offset of the plan's flags that segments raise (u64, only growing)
  std::uint32_t counter_flags = 0;        // plan flags [0, counter_flags) are those counters; 0: no waits in the kernel
  const std::uint64_t* epoch = nullptr;   // device: the step; a wait for count c is met at epoch * c * signals_per_count
  std::uint32_t signals_per_count = 1;    // raises per counted signal (the exchange's CTAs per peer)
};

struct PlannedGemmRun {
  // The work: a tile table and its count, or one GEMM's tiles of a plan, never both.
  const GemmTileEntry* table = nullptr;  // device
  const int* count = nullptr;            // device: number of entries (a multiple of the cluster size)
  // device: a plan whose tiles [first, first + layer_tiles[plan_layer]) of this GEMM's layer are
  // its entries (first: 0 for GEMM0, layer_tiles[0] for GEMM1), read as a table entry each: its
  // expert is the group, its columns one output tile (col_begin / the epilogue's output tile
  // width), its signal_flag the flag. The compiler gives them this GEMM's tile shape and order
  // (cluster mates adjacent, padding mates as tiles of no rows). An overflowed plan runs nothing.
  const PlanTables* plan = nullptr;
  int plan_layer = 0;
  const __nv_bfloat16* A = nullptr;
  int a_rows = 0;
  const __nv_bfloat16* B = nullptr;
  int groups = 0;
  __nv_bfloat16* D = nullptr;
  int N = 0, K = 0;
  unsigned* flags = nullptr;                    // device; nullptr: no flags raised
  int flag_offset = 0;                          // an entry's flag f adds to flags[f - flag_offset] (a plan's
                                                // flags are numbered per rank; the array holds a range)
  unsigned long long* tile_times = nullptr;     // optional device [2 * entries]: globaltimer at the
                                                // start of the tile's MMAs and after its flag
  PaddingMma padding_mma = PaddingMma::Default;  // see PaddingMma (others: A/B measurements, stress)
  ItemFetch item_fetch = ItemFetch::Default;     // see ItemFetch
  PlannedProbeRecord* probe = nullptr;  // optional, 16-byte aligned [grid_ctas() * kProbeRoles]:
                                        // where each role is (planned_gemm_probe.hpp; diagnosis)
  // device, optional [groups][N] fp32: added to each sum before the activation (GPT-OSS's expert
  // biases; a SwiGLU GEMM's gate and up biases interleaved as its B's columns), as the CPU adds
  // a bias to the finished fp32 sum
  const float* bias = nullptr;
  SwigluVariant swiglu;  // the SwiGLU epilogue's variant (GPT-OSS's clamp); the default is silu(gate) * up
  PlannedTileWaits tile_waits;  // a plan's tiles' waits on counters (counter_flags 0: none)
};

class PlannedGemm {
 public:
  // sm_limit > 0 leaves the other SMs free for a concurrent kernel.
  PlannedGemm(PlannedCluster cluster, PlannedEpilogue epilogue, int max_groups, int device, int sm_limit = 0);
  ~PlannedGemm();
  PlannedGemm(const PlannedGemm&) = delete;
  PlannedGemm& operator=(const PlannedGemm&) = delete;

  // Enqueues a per-group pointer setup and the GEMM on `stream`. N, K multiples of 8 (SwiGLU:
  // N a multiple of 16), pointers 16-byte aligned, groups <= max_groups; checked here.
  void run(cudaStream_t stream, const PlannedGemmRun& run);

  PlannedCluster cluster() const;
  PlannedEpilogue epilogue() const;
  int grid_ctas() const;  // CTAs of the persistent grid

  struct Backend;

 private:
  std::unique_ptr<Backend> backend_;
  PlannedCluster cluster_;
  PlannedEpilogue epilogue_;
  int max_groups_;
};

}  // namespace tilemoe::cuda
