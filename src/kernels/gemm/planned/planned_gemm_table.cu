// The sequential tile table of the planned GEMM, built on the device (no host sync) by the
// decode of plan/tile_table.hpp, whose host twin is build_tile_table; and the host-side check.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tilemoe/cuda/cuda_check.hpp"
#include "kernels/gemm/planned/planned_gemm.hpp"
#include "plan/tile_table.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

constexpr int kBuilderThreads = 1024;
constexpr int kGroupsPerThread = 4;
constexpr int kMaxBuilderGroups = kBuilderThreads * kGroupsPerThread;

__global__ void build_tile_table_kernel(const int* __restrict__ row_offset, int groups, int n_tiles,
                                        PlannedCluster cluster, TileFlags flags, int band_block,
                                        GemmTileEntry* __restrict__ table, int capacity, int* count) {
  __shared__ int entry_offset[kMaxBuilderGroups + 1];
  __shared__ int band_offset[kMaxBuilderGroups + 1];
  __shared__ int totals[2];
  const int t = int(threadIdx.x);
  // Per-thread sums of 4 consecutive groups, then a block-wide scan of those sums (Hillis-Steele
  // over 1024 values in smem: 10 steps).
  __shared__ int scan_e[kBuilderThreads], scan_b[kBuilderThreads];
  int local_e[kGroupsPerThread], local_b[kGroupsPerThread], sum_e = 0, sum_b = 0;
  for (int j = 0; j < kGroupsPerThread; ++j) {
    const int g = t * kGroupsPerThread + j;
    GroupTiles gt;
    if (g < groups) gt = group_tiles(row_offset[g + 1] - row_offset[g], n_tiles, cluster, kPlannedTileM);
    local_e[j] = sum_e;
    local_b[j] = sum_b;
    sum_e += gt.entries;
    sum_b += gt.m_tiles;
  }
  scan_e[t] = sum_e;
  scan_b[t] = sum_b;
  __syncthreads();
  for (int step = 1; step < kBuilderThreads; step *= 2) {
    const int add_e = t >= step ? scan_e[t - step] : 0;
    const int add_b = t >= step ? scan_b[t - step] : 0;
    __syncthreads();
    scan_e[t] += add_e;
    scan_b[t] += add_b;
    __syncthreads();
  }
  const int base_e = scan_e[t] - sum_e, base_b = scan_b[t] - sum_b;
  for (int j = 0; j < kGroupsPerThread; ++j) {
    const int g = t * kGroupsPerThread + j;
    if (g < groups) {
      entry_offset[g] = base_e + local_e[j];
      band_offset[g] = base_b + local_b[j];
    }
  }
  if (t == kBuilderThreads - 1) {
    totals[0] = scan_e[t];
    totals[1] = scan_b[t];
    entry_offset[groups] = scan_e[t];
  }
  __syncthreads();
  const int total = totals[0];
  if (total > capacity) {
    if (t == 0) *count = -1;
    return;
  }
  for (int index = t; index < total; index += kBuilderThreads) {
    // the group holding entry `index`: the last g with entry_offset[g] <= index
    int lo = 0, hi = groups - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (entry_offset[mid] <= index) lo = mid; else hi = mid - 1;
    }
    const int begin = row_offset[lo];
    table[index] = decode_entry(lo, begin, row_offset[lo + 1] - begin, band_offset[lo], index - entry_offset[lo], index,
                                n_tiles, cluster, flags, band_block, kPlannedTileM);
  }
  if (t == 0) *count = total;
}

int n_tiles_of(int N) { return tile_ceil_div(N, kPlannedTileN); }

}  // namespace

const char* planned_cluster_name(PlannedCluster cluster) {
  return cluster == PlannedCluster::M2 ? "c2x1" : cluster == PlannedCluster::N2 ? "c1x2" : "none";
}

std::int64_t max_tile_entries(std::int64_t rows, int groups, int N, PlannedCluster cluster) {
  (void)cluster;  // the bound below holds for both clusters
  const std::int64_t n_tiles = n_tiles_of(N);
  // per group: m tiles <= rows_g / 128 + 1, padded to 2 (M2) -> + 1 more; N tiles padded to 2 (N2)
  return (rows / kPlannedTileM + 2 * static_cast<std::int64_t>(groups)) * (n_tiles + 1);
}

void launch_build_tile_table(cudaStream_t stream, const int* row_offset, int groups, int N, PlannedCluster cluster,
                             TileFlags flags, GemmTileEntry* table, int capacity, int* count, int band_block) {
  check_band_block(band_block);
  if (groups <= 0 || groups > kMaxBuilderGroups) {
    throw_bad_input("tile table: " + std::to_string(groups) + " groups (1.." + std::to_string(kMaxBuilderGroups) +
                    " supported)");
  }
  if (N <= 0) throw_bad_input("tile table: N must be positive");
  build_tile_table_kernel<<<1, kBuilderThreads, 0, stream>>>(row_offset, groups, n_tiles_of(N), cluster, flags, band_block,
                                                             table, capacity, count);
  TILEMOE_CUDA_CHECK_LAUNCH("build_tile_table_kernel<<<>>>");
}

void check_tile_table(const std::vector<GemmTileEntry>& table, int groups, int a_rows, int N, PlannedCluster cluster,
                      int flag_count) {
  const int n_tiles = n_tiles_of(N);
  if (table.size() % 2 != 0) {
    throw_bad_input("tile table: " + std::to_string(table.size()) + " entries, not a multiple of the cluster size 2");
  }
  for (std::size_t i = 0; i < table.size(); ++i) {
    const GemmTileEntry& e = table[i];
    auto fail = [&](const std::string& what) {
      throw_bad_input("tile table entry " + std::to_string(i) + " (group " + std::to_string(e.group) + ", rows " +
                      std::to_string(e.row_begin) + "+" + std::to_string(e.rows) + ", col tile " +
                      std::to_string(e.col_tile) + "): " + what);
    };
    if (e.group < 0 || e.group >= groups) fail("group outside [0, " + std::to_string(groups) + ")");
    if (e.rows < 0 || e.rows > kPlannedTileM) fail("rows outside 0..128");
    if (e.row_begin < 0 || e.row_begin + e.rows > a_rows) fail("rows outside A's " + std::to_string(a_rows) + " rows");
    if (e.col_tile < 0 || e.col_tile >= n_tiles) fail("col tile outside [0, " + std::to_string(n_tiles) + ")");
    if (e.flag < -1 || e.flag >= flag_count) fail("flag outside [-1, " + std::to_string(flag_count) + ")");
    if (i % 2 == 1) {
      const GemmTileEntry& p = table[i - 1];
      if (cluster == PlannedCluster::M2 && (p.group != e.group || p.col_tile != e.col_tile)) {
        fail("its 2x1 cluster mate (entry " + std::to_string(i - 1) + ") has another group or col tile");
      }
      if (cluster == PlannedCluster::N2 && p.row_begin != e.row_begin) {
        fail("its 1x2 cluster mate (entry " + std::to_string(i - 1) + ") starts at another row");
      }
    }
  }
}

}  // namespace tilemoe::cuda
