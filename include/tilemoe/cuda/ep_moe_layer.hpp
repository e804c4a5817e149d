#pragma once
// One rank's MoE layer with expert parallelism over a world of GPUs (real ranks through NCCL,
// or virtual ranks on one GPU): router, layout, permute, dispatch to the experts' owners, the
// local experts' FFN, the outputs back to their sources, combine. This is the sequential
// expert-parallel baseline: each stage waits for the one before it.
//
// Two dispatch paths, bitwise identical results:
//  Device: tilemoe's device-API exchange kernels (src/exec/cuda/ep_exchange.hpp): counts stay
//          on the device, rows are stored straight into the owner's memory at their final
//          place, no host synchronisation; a forward can be captured in a CUDA graph.
//  Host:   the Megatron "alltoall" way: the counts are gathered and brought to the host (a
//          stream synchronisation per step), then host-API all-to-alls of known sizes and a
//          reorder of the received blocks on the device.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tilemoe/config.hpp"
#include "tilemoe/cuda/moe_layer.hpp"
#include "tilemoe/cuda/rank_transport.hpp"
#include "tilemoe/plan.hpp"
#include "tilemoe/routing.hpp"
#include "tilemoe/strategy.hpp"
#include "tilemoe/strategy_options.hpp"
#include "tilemoe/trace.hpp"
#include "tilemoe/weights.hpp"

namespace tilemoe::cuda {

enum class DispatchPath { Device, Host };
const char* dispatch_path_name(DispatchPath path);

// Events between the stages of an expert-parallel forward (per-stage timing).
enum EpStage {
  kEpRouter, kEpLayout, kEpPermute, kEpDispatch, kEpGemm0, kEpActivation, kEpGemm1, kEpCombineSend, kEpCombine,
  kEpStageCount
};
const char* ep_stage_name(int stage);
struct EpStageEvents {
  cudaEvent_t boundary[kEpStageCount + 1];
};

struct EpMoeLayerOptions {
  GemmPath gemm = GemmPath::Planned;
  DispatchPath dispatch = DispatchPath::Device;
  // CTAs of the exchange kernels per destination rank; 0 picks as many as fit on the GPU
  // together with the exchange kernels of the other ranks sharing it (they wait for each
  // other, so all of them must be resident at once). Values that do not fit are bad input.
  // Comet's exchange serves every peer from a few CTAs (CometOptions::dispatch_ctas, send_ctas):
  // 0 or 1 there.
  int exchange_ctas_per_peer = 0;
  // Sequential, TileSignal, Comet or Auto (include/tilemoe/strategy.hpp; auto chooses between
  // sequential and tile_signal). Comet on the GPU overlaps the dispatch with GEMM0 (each GEMM0
  // tile waits for the sources of its rows) and runs GEMM1 in column splits.
  Strategy strategy = Strategy::Sequential;
  TileSignalOptions tile_signal;  // its knobs; 0 = the strategy's choice
  CometOptions comet;
  // Rows a rank can receive per step; 0 = the dropless worst case (every source's tokens x
  // min(top_k, local experts) rows, 3.8 GB per rank at DeepSeek-V3's shape with 8 x 4096
  // tokens). A smaller capacity (DeepEP's max tokens per rank) saves memory; a step whose
  // routing exceeds it fails on every rank with a bad-input error, it never drops rows.
  std::int64_t receive_rows = 0;
  // Record device timestamps of GEMM1's tiles and (tile_signal) the consumer's segments, for
  // last_trace(). Costs a store per tile and segment.
  bool record_trace = false;
  // How the dispatch sends a token (include/tilemoe/plan.hpp): OncePerRank sends it once to
  // each other rank holding any of its experts, which places it for each of them (DeepEP's
  // volume: about 0.66x the bytes at DeepSeek-V3's routing over 8 ranks, 0.50x group-limited);
  // RowPerExpert once per chosen expert. Unset: OncePerRank on the device path of a load/store
  // world of several ranks, RowPerExpert otherwise (the host path's all-to-all and GIN peers
  // send a row per expert; asking them for OncePerRank is bad input). The outputs are the same
  // bits either way.
  std::optional<DispatchVolume> dispatch_volume;
};

// Not options of a MoE layer, and not for users: a fault to inject (tests) and the mode of the
// exchange benchmark.
struct EpMoeLayerHarness {
  // This rank's exchange kernels send nothing (no counts, no rows), as a stalled or dead peer
  // would; the other ranks must fail with a timeout naming it.
  bool silent = false;
  // This rank sends its counts, then no rows through its plan's segments: its peers compile their plans and start their
  // GEMMs, whose waits for its rows (comet's GEMM0 tiles) must end in a timeout naming it.
  bool silent_rows = false;
  // The experts return their input rows unchanged and no expert weights are allocated: the
  // exchange alone (DeepEP's dispatch/combine benchmark). Not a MoE layer.
  bool identity_experts = false;
  // A corrupted device plan (tile_signal): the consumer's first band waits for a flag that no
  // GEMM tile raises; the bounded wait must turn it into an error naming that wait.
  bool unsignalled_band_wait = false;
  // A corrupted device plan (either strategy): the first dispatch segment names a flag the
  // exchange does not hold; the rank must refuse to run it with an error naming the segment.
  bool unrunnable_dispatch_segment = false;
  // Compile the step's plan on the device where the layer would not need it (the host dispatch
  // path on the stock GEMM; sequential only), for the tests to hold against the host compiler
  // (EpMoeLayerInspector::last_device_plan). The device exchange and the planned GEMMs walk it
  // every step anyway.
  bool build_device_plan = false;
};

class EpMoeLayer {
 public:
  // Bytes of the symmetric region each rank needs for `layer` (layer.tokens = the most tokens
  // a rank forwards per step) in a world of `world` ranks, with these options (their
  // receive_rows). `remote_peers`: some peers are on other nodes (GIN), so the rows a rank
  // sends must live in its region too.
  static std::size_t region_bytes(const MoeConfig& layer, int world, const EpMoeLayerOptions& options = {},
                                  bool remote_peers = false);
  // The device memory one rank's layer allocates besides its region (weights of its experts,
  // routing, row buffers, tables; an overlap strategy's flags; Auto counted as TileSignal; a
  // shared expert `shared_expert_ffn` wide, 0: none), in the driver's 2 MiB pages: an upper
  // bound, to refuse what will not fit up front.
  static std::size_t device_bytes(const MoeConfig& layer, int world, const EpMoeLayerOptions& options = {},
                                  bool remote_peers = false, std::int64_t shared_expert_ffn = 0);

  // Construct on every rank of the world at about the same time (each rank in its own thread
  // or process): the constructor ends with a host barrier of the world. No forward of another
  // layer may be in flight on the same world. `weights` holds all experts (each rank uploads
  // its own); RandomDeviceWeights draws the same layer as the one-GPU MoeLayer with that seed.
  EpMoeLayer(const MoeConfig& layer, const ExpertWeights& weights, RankTransport& transport, EpMoeLayerOptions options = {},
             EpMoeLayerHarness harness = {});
  EpMoeLayer(const MoeConfig& layer, RandomDeviceWeights weights, RankTransport& transport, EpMoeLayerOptions options = {},
             EpMoeLayerHarness harness = {});
  ~EpMoeLayer();
  EpMoeLayer(const EpMoeLayer&) = delete;
  EpMoeLayer& operator=(const EpMoeLayer&) = delete;

  // One step; every rank of the world must call it, each with its own tokens (0..layer.tokens).
  // input [tokens, hidden] bf16, router_logits [tokens, experts] fp32 (or null: the gate computes
  // them, set_router_gate), output [tokens, hidden]
  // bf16, device pointers 16-byte aligned. With ranks sharing a GPU (virtual ranks) the stream
  // must be the world's transport.stream(RankStream::Main): other streams can share a hardware
  // queue with a peer's waiting kernel (rank_transport.hpp). A captured forward of such ranks:
  // instantiate and upload (cudaGraphUpload) every rank's graph before any rank launches one,
  // and destroy them after every rank's replay (both may synchronise the device, which would
  // wait for a peer's graph waiting for this rank). After a failed step (see check) the layer
  // refuses further forwards.
  void forward(cudaStream_t stream, const __nv_bfloat16* input, const float* router_logits, __nv_bfloat16* output,
               std::int64_t tokens, const EpStageEvents* events = nullptr);

  // Waits for the stream, then throws what the step found: a NaN/Inf router logit (bad
  // input), a device wait that timed out (a Timeout error naming the rank that stalled).
  void check(cudaStream_t stream);

  // The last forward's GEMM1 tiles (track "GEMM1 tiles", a lane per CTA) and consumer segments
  // (track "consumer", a lane per CTA), %globaltimer ns; needs record_trace. Waits for the
  // stream as check() does, bounded: a stalled step is a Timeout error, never a hang.
  std::vector<DeviceSpan> last_trace(cudaStream_t stream) const;

  // The router's selection bias (DeepSeek-V3's e_score_correction_bias: one per expert, added to
  // the scores to choose the experts, not to weigh them) for the forwards that follow; empty:
  // none. Call it between steps (after check()): it copies on the layer's own stream and waits,
  // bounded.
  void set_selection_bias(std::span<const float> bias);
  // The router inside the layer: its gate [experts][hidden] (Hugging Face's gate.weight), for
  // the forwards given no router logits (router_logits = nullptr): logits = input x gate^T with
  // fp32 sums (bf16 inputs), rounded to `logits_dtype` (Mixtral and Qwen compute them in the
  // model's bf16, DeepSeek-V3 in fp32). Call it between steps; it copies and waits, bounded.
  void set_router_gate(std::span<const float> gate, DType logits_dtype = DType::BF16);

  // The routing of this rank's tokens in the last forward (waits for the stream, bounded).
  Routing last_routing(cudaStream_t stream, std::int64_t tokens) const;

  const MoeConfig& config() const;
  int exchange_ctas_per_peer() const;
  Strategy strategy() const;    // what runs: Auto resolved to Sequential or TileSignal
  int consumer_ctas() const;    // TileSignal's consumer CTAs (0 otherwise)
  std::string description() const;  // "device dispatch, 4 CTAs per peer, planned c1x2"

 private:
  friend struct EpMoeLayerInspector;  // the GPU tests' view of the device-built tables (src/layer)
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tilemoe::cuda
