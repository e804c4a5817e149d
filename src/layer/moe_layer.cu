#include "tilemoe/cuda/moe_layer.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "comm/cuda/bounded_sync.hpp"
#include "core/cuda/current_device.hpp"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/cuda/device_array.hpp"
#include "ep_layer_inspector.hpp"
#include "layer_routing.hpp"
#include "tilemoe/cuda/ep_moe_layer.hpp"
#include "tilemoe/cuda/virtual_world.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

// The one-GPU layer is the expert-parallel layer in a world of one: one code path. A world of
// one skips both exchange copies (its expert rows are the permuted rows), so it runs what the
// one-GPU layer ran before, to the bit and within 1.00-1.04x of its time (H100, 2026-12-06,
// BENCHMARKS.md). What stays here is the one-GPU API: any stream, the stage
// events of seven stages, and waits bounded by options.wait_limit with their own messages.
struct MoeLayer::Impl {
  MoeConfig config;
  int device = 0;
  MoeLayerOptions options;
  std::unique_ptr<VirtualWorld> world;
  std::unique_ptr<EpMoeLayer> layer;

  void init(const MoeConfig& c, int dev, MoeLayerOptions opts);
  EpMoeLayerOptions layer_options() const {
    EpMoeLayerOptions o;
    o.gemm = options.gemm;
    o.dispatch = DispatchPath::Device;
    o.strategy = Strategy::Sequential;
    return o;
  }
  // a bounded wait for the stream; `who` names the caller in the timeout error
  void wait(cudaStream_t stream, const char* who) const;
};

void MoeLayer::Impl::init(const MoeConfig& c, int dev, MoeLayerOptions opts) {
  validate_cuda_layer(c);
  if (opts.wait_limit.count() <= 0 || opts.wait_limit > std::chrono::hours(24)) {
    throw_bad_input("MoeLayerOptions::wait_limit must be positive and at most 24 hours");
  }
  config = c;
  device = dev;
  options = opts;
  use_device(device);
  VirtualWorldOptions world_options;
  world_options.timeout = opts.wait_limit;
  world = std::make_unique<VirtualWorld>(1, EpMoeLayer::region_bytes(c, 1, layer_options()), device, world_options);
  world->rank(0).bind_thread();
}

MoeLayer::MoeLayer(const MoeConfig& config, RandomDeviceWeights weights, int device, MoeLayerOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->init(config, device, options);
  impl_->layer = std::make_unique<EpMoeLayer>(config, weights, impl_->world->rank(0), impl_->layer_options());
}

MoeLayer::MoeLayer(const MoeConfig& config, const ExpertWeights& weights, int device, MoeLayerOptions options)
    : impl_(std::make_unique<Impl>()) {
  check_weights_match(weights, config);
  impl_->init(config, device, options);
  impl_->layer = std::make_unique<EpMoeLayer>(config, weights, impl_->world->rank(0), impl_->layer_options());
}

std::size_t MoeLayer::device_bytes(const MoeConfig& c, MoeLayerOptions options, std::int64_t shared_expert_ffn) {
  validate_cuda_layer(c);
  EpMoeLayerOptions o;
  o.gemm = options.gemm;
  DeviceFootprint f;
  f.add(EpMoeLayer::region_bytes(c, 1, o), 1);  // the world's region
  for (int i = 0; i < 4; ++i) f.add(1, 1);      // the world's own small records
  return f.bytes() + EpMoeLayer::device_bytes(c, 1, o, false, shared_expert_ffn);
}

MoeLayer::~MoeLayer() = default;

const MoeConfig& MoeLayer::config() const { return impl_->config; }

std::string MoeLayer::gemm_description() const { return EpMoeLayerInspector::gemm_description(*impl_->layer); }

void MoeLayer::forward(cudaStream_t stream, const __nv_bfloat16* input, const float* router_logits,
                       __nv_bfloat16* output, std::int64_t tokens, const StageEvents* events) {
  Impl& m = *impl_;
  use_device(m.device);
  if (events == nullptr) {
    m.layer->forward(stream, input, router_logits, output, tokens);
    return;
  }
  // The world of one's nine stage boundaries on the seven of this layer: its dispatch (the
  // offsets' copy) counts into the permute, its empty combine send into the combine (an event
  // recorded twice keeps its last record).
  const cudaEvent_t* b = events->boundary;
  const EpStageEvents ep{{b[kRouter], b[kLayout], b[kPermute], b[kGemm0], b[kGemm0], b[kActivation], b[kGemm1], b[kCombine],
                          b[kCombine], b[kStageCount]}};
  static_assert(kEpStageCount == 9 && kStageCount == 7);
  m.layer->forward(stream, input, router_logits, output, tokens, &ep);
}

const char* stage_name(int stage) {
  static const char* names[] = {"router", "layout", "permute", "gemm0", "activation", "gemm1", "combine"};
  return stage >= 0 && stage < kStageCount ? names[stage] : "?";
}

const int* MoeLayer::row_offset() const { return EpMoeLayerInspector::row_offset(*impl_->layer); }
const __nv_bfloat16* MoeLayer::permuted_rows() const { return EpMoeLayerInspector::expert_rows(*impl_->layer); }
const __nv_bfloat16* MoeLayer::expert_weights0() const { return EpMoeLayerInspector::expert_weights0(*impl_->layer); }
const __nv_bfloat16* MoeLayer::expert_weights2() const { return EpMoeLayerInspector::expert_weights2(*impl_->layer); }

void MoeLayer::Impl::wait(cudaStream_t stream, const char* who) const {
  if (!wait_for_stream(stream, options.wait_limit)) {
    throw Error(ErrorKind::Timeout, std::string("MoeLayer::") + who + ": the stream's work (the last forward and " +
                                        "whatever was queued before it) did not finish within " +
                                        std::to_string(options.wait_limit.count()) + " ms: a kernel stalled");
  }
}

// The stream is waited for here first, bounded by wait_limit with this layer's message; the
// world's own checks then find it finished.
void MoeLayer::check(cudaStream_t stream) {
  impl_->wait(stream, "check");
  try {
    impl_->layer->check(stream);
  } catch (const Error& e) {
    // a NaN logit: the one-GPU message names no rank
    if (e.kind() != ErrorKind::BadInput) throw;
    const std::string text = e.what();
    const std::size_t token = text.find("token ");
    throw_bad_input(token == std::string::npos ? text : text.substr(token));
  }
}

void MoeLayer::set_selection_bias(std::span<const float> bias) { impl_->layer->set_selection_bias(bias); }
void MoeLayer::set_router_gate(std::span<const float> gate, DType logits_dtype) { impl_->layer->set_router_gate(gate, logits_dtype); }

Routing MoeLayer::last_routing(cudaStream_t stream, std::int64_t tokens) const {
  if (tokens < 0 || tokens > impl_->config.tokens) {
    throw_bad_input("last_routing of " + std::to_string(tokens) + " tokens on a layer sized for " +
                    std::to_string(impl_->config.tokens));
  }
  impl_->wait(stream, "last_routing");
  return impl_->layer->last_routing(stream, tokens);
}

}  // namespace tilemoe::cuda
