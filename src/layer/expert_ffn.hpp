#pragma once
// The expert feed-forward of one GPU's experts on rows already grouped by expert:
// y = (act(rows W0^T)) W2^T per group, through the planned GEMM (activation fused into GEMM0)
// or CUTLASS's stock grouped kernels plus a separate activation (the baseline). Shared by the
// one-GPU layer and the expert-parallel layer, which differ only in where the rows come from.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/cuda/device_footprint.hpp"
#include "tilemoe/cuda/device_array.hpp"
#include "kernels/gemm/planned/planned_gemm.hpp"
#include "tilemoe/config.hpp"
#include "tilemoe/cuda/moe_layer.hpp"
#include "tilemoe/weights.hpp"

namespace tilemoe::cuda {

// The FFN's schedule as the strategy chose it (planned path only).
struct ExpertFfnOptions {
  int gemm0_sm_limit = 0;  // > 0: GEMM0 leaves the other SMs to a concurrent dispatch (comet)
  int gemm1_sm_limit = 0;  // > 0: GEMM1 leaves the other SMs to a concurrent consumer
  // device: the plan whose tiles the planned GEMMs walk (GEMM0 its layer-0 range, GEMM1 its
  // layer-1 range), compiled for their tiling (gpu_sequential_shape) before each run; the
  // planned path needs one, and its tiles' order and flags are the plan's.
  const PlanTables* plan = nullptr;
};

class ExpertFfn {
 public:
  // `experts` experts of `layer`'s shape, the first being global expert `first_expert`, for at
  // most `max_rows` rows per run. `rows_per_expert` is the expected load, which picks the
  // stock kernels' configuration (the planned path always runs on 1x2 clusters).
  ExpertFfn(const MoeConfig& layer, std::int64_t first_expert, std::int64_t experts, std::int64_t max_rows,
            double rows_per_expert, GemmPath path, int device, ExpertFfnOptions options = {});
  ~ExpertFfn();
  ExpertFfn(const ExpertFfn&) = delete;
  // The device memory the constructor above allocates (DeviceFootprint: pages, an upper bound).
  static DeviceFootprint device_bytes(const MoeConfig& layer, std::int64_t experts, std::int64_t max_rows, GemmPath path);
  ExpertFfn& operator=(const ExpertFfn&) = delete;

  // Weights of global experts [first_expert, first_expert + experts) from the host, or drawn
  // on the device from a counter hash of the global index, so that the experts of every rank
  // of a world together equal one layer's drawn with the same seed.
  void upload(const ExpertWeights& weights);
  void draw(std::uint64_t seed);

  // rows [rows_bound][hidden] -> y [rows_bound][hidden], where rows_bound <= max_rows bounds
  // row_offset[experts] (device, [experts + 1]; known on the host: tokens * top_k on one GPU,
  // the receive capacity with expert parallelism), in three stages enqueued in this order (on
  // the planned path after the plan's compile); a caller records its stage events, or starts
  // concurrent work, between them.
  // GEMM0, with the activation fused on the planned path; `tile_waits` (planned path): the
  // plan's waits its tiles wait for in the GEMM, while a concurrent dispatch lands their rows;
  // `gemm0_tile_times` (device, 2 per GEMM0 tile of the plan) as GEMM1's below.
  void run_gemm0(cudaStream_t stream, const int* row_offset, const __nv_bfloat16* rows, std::int64_t rows_bound,
                 const PlannedTileWaits& tile_waits = {}, unsigned long long* gemm0_tile_times = nullptr);
  // The activation: a kernel of its own on the stock path, nothing on the planned path.
  void run_activation(cudaStream_t stream, std::int64_t rows_bound);
  // GEMM1 into y. The flags its plan's tiles raise (plan flags [gemm1_flag_offset, ...)) land
  // in `gemm1_flags` (device; nullptr: none raised); `gemm1_tile_times` (device, 2 per tile of
  // the plan) receives its tile start and flag times (planned path).
  void run_gemm1(cudaStream_t stream, const int* row_offset, std::int64_t rows_bound, __nv_bfloat16* y,
                 unsigned* gemm1_flags = nullptr, int gemm1_flag_offset = 0, unsigned long long* gemm1_tile_times = nullptr);

  int gemm0_grid_ctas() const;  // the persistent GEMMs' CTAs (cluster c takes items c, c + C, ...)
  int gemm1_grid_ctas() const;

  const __nv_bfloat16* weights0() const { return w0_.data(); }  // [experts][gemm0_n][hidden]
  const __nv_bfloat16* weights2() const { return w2_.data(); }  // [experts][hidden][ffn]
  std::string description() const;  // "planned c1x2" / "stock coop128x256_c1x2"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  DeviceArray<__nv_bfloat16> w0_, w2_;
};

}  // namespace tilemoe::cuda
