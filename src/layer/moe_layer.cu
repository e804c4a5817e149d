#include "tilemoe/cuda/moe_layer.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "comm/cuda/bounded_sync.hpp"
#include "core/cuda/current_device.hpp"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/cuda/device_array.hpp"
#include "expert_ffn.hpp"
#include "layer_routing.hpp"
#include "kernels/moe_kernels.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

struct MoeLayer::Impl : LayerRouting {
  MoeConfig config;
  int device = 0;
  MoeLayerOptions options;
  DeviceArray<__nv_bfloat16> rows, y;
  std::unique_ptr<ExpertFfn> ffn;

  void init(const MoeConfig& c, int dev, MoeLayerOptions opts);
  // a bounded wait for the stream; `who` names the caller in the timeout error
  void wait(cudaStream_t stream, const char* who) const;
};

MoeLayer::MoeLayer(const MoeConfig& config, RandomDeviceWeights weights, int device, MoeLayerOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->init(config, device, options);
  impl_->ffn->draw(weights.seed);
}

void MoeLayer::Impl::init(const MoeConfig& c, int dev, MoeLayerOptions opts) {
  validate_cuda_layer(c);
  if (opts.wait_limit.count() <= 0 || opts.wait_limit > std::chrono::hours(24)) {
    throw_bad_input("MoeLayerOptions::wait_limit must be positive and at most 24 hours");
  }
  config = c;
  device = dev;
  options = opts;
  use_device(device);
  const std::int64_t E = c.num_experts, H = c.hidden;
  const auto slots = static_cast<std::size_t>(c.tokens * c.top_k);
  const std::size_t slot_room = slots > 0 ? slots : 1;
  allocate(c);
  rows = DeviceArray<__nv_bfloat16>(slot_room * static_cast<std::size_t>(H));
  y = DeviceArray<__nv_bfloat16>(slot_room * static_cast<std::size_t>(H));
  const double rows_per_expert = static_cast<double>(slots) / static_cast<double>(E);
  ffn = std::make_unique<ExpertFfn>(c, 0, E, static_cast<std::int64_t>(slots), rows_per_expert, opts.gemm, device);
}

std::size_t MoeLayer::device_bytes(const MoeConfig& c, MoeLayerOptions options) {
  validate_cuda_layer(c);
  const auto slots = static_cast<std::size_t>(std::max<std::int64_t>(c.tokens * c.top_k, 0));
  const std::size_t slot_room = slots > 0 ? slots : 1;
  DeviceFootprint f = LayerRouting::device_bytes(c);
  f.add(slot_room * static_cast<std::size_t>(c.hidden), sizeof(__nv_bfloat16));  // rows
  f.add(slot_room * static_cast<std::size_t>(c.hidden), sizeof(__nv_bfloat16));  // y
  f.add(ExpertFfn::device_bytes(c, c.num_experts, static_cast<std::int64_t>(slots), options.gemm));
  return f.bytes();
}

MoeLayer::MoeLayer(const MoeConfig& config, const ExpertWeights& weights, int device, MoeLayerOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (weights.hidden != config.hidden || weights.ffn_hidden != config.ffn_hidden ||
      weights.num_experts != config.num_experts || weights.activation != config.activation) {
    throw_bad_input("the expert weights do not match the layer config");
  }
  impl_->init(config, device, options);
  impl_->ffn->upload(weights);
}

MoeLayer::~MoeLayer() = default;

const MoeConfig& MoeLayer::config() const { return impl_->config; }

std::string MoeLayer::gemm_description() const { return impl_->ffn->description(); }

void MoeLayer::forward(cudaStream_t stream, const __nv_bfloat16* input, const float* router_logits,
                       __nv_bfloat16* output, std::int64_t tokens, const StageEvents* events) {
  Impl& m = *impl_;
  const MoeConfig& c = m.config;
  if (tokens < 0 || tokens > c.tokens) {
    throw_bad_input("forward of " + std::to_string(tokens) + " tokens on a layer sized for " + std::to_string(c.tokens));
  }
  for (const void* p : {static_cast<const void*>(input), static_cast<const void*>(output)}) {
    if (tokens > 0 && reinterpret_cast<std::uintptr_t>(p) % 16 != 0) throw_bad_input("input and output must be 16-byte aligned");
  }
  use_device(m.device);
  const int T = static_cast<int>(tokens), k = static_cast<int>(c.top_k);
  const int H = static_cast<int>(c.hidden);
  const int slots = T * k;
  auto mark = [&](int stage) {
    if (events) TILEMOE_CUDA_CHECK(cudaEventRecord(events->boundary[stage], stream));
  };
  mark(kRouter);
  m.launch_router(stream, router_logits, T, c);
  mark(kLayout);
  m.launch_layout(stream, T, c);
  m.ffn->build_tables(stream, m.row_offset.data());
  mark(kPermute);
  launch_permute(stream, input, H, k, m.slot_of_row.data(), slots, m.rows.data());
  mark(kGemm0);
  m.ffn->run_gemm0(stream, m.row_offset.data(), m.rows.data(), slots);
  mark(kActivation);
  m.ffn->run_activation(stream, slots);
  mark(kGemm1);
  m.ffn->run_gemm1(stream, m.row_offset.data(), slots, m.y.data());
  mark(kCombine);
  launch_combine(stream, m.y.data(), m.weight.data(), m.row_of_slot.data(), T, k, H, output);
  mark(kStageCount);
}

const char* stage_name(int stage) {
  static const char* names[] = {"router", "layout", "permute", "gemm0", "activation", "gemm1", "combine"};
  return stage >= 0 && stage < kStageCount ? names[stage] : "?";
}

const int* MoeLayer::row_offset() const { return impl_->row_offset.data(); }
const __nv_bfloat16* MoeLayer::permuted_rows() const { return impl_->rows.data(); }
const __nv_bfloat16* MoeLayer::expert_weights0() const { return impl_->ffn->weights0(); }
const __nv_bfloat16* MoeLayer::expert_weights2() const { return impl_->ffn->weights2(); }

void MoeLayer::Impl::wait(cudaStream_t stream, const char* who) const {
  if (!wait_for_stream(stream, options.wait_limit)) {
    throw Error(ErrorKind::Timeout, std::string("MoeLayer::") + who + ": the stream's work (the last forward and " +
                                        "whatever was queued before it) did not finish within " +
                                        std::to_string(options.wait_limit.count()) + " ms: a kernel stalled");
  }
}

// The copies run on the caller's stream once it is idle (cudaMemcpy would go through the legacy
// stream and wait for every blocking stream of the device), and are waited for as boundedly.
void MoeLayer::check(cudaStream_t stream) {
  impl_->wait(stream, "check");
  int bad = INT_MAX;
  TILEMOE_CUDA_CHECK(cudaMemcpyAsync(&bad, impl_->error_token.data(), sizeof bad, cudaMemcpyDeviceToHost, stream));
  impl_->wait(stream, "check");
  if (bad != INT_MAX) {
    throw_bad_input("token " + std::to_string(bad) + ": a router logit is NaN or infinite; the router produced invalid values");
  }
}

Routing MoeLayer::last_routing(cudaStream_t stream, std::int64_t tokens) const {
  if (tokens < 0 || tokens > impl_->config.tokens) {
    throw_bad_input("last_routing of " + std::to_string(tokens) + " tokens on a layer sized for " +
                    std::to_string(impl_->config.tokens));
  }
  impl_->wait(stream, "last_routing");
  Routing r;
  r.tokens = tokens;
  r.top_k = impl_->config.top_k;
  r.expert.resize(static_cast<std::size_t>(tokens * r.top_k));
  r.weight.resize(r.expert.size());
  r.kept.assign(r.expert.size(), 1);
  if (!r.expert.empty()) {
    TILEMOE_CUDA_CHECK(
        cudaMemcpyAsync(r.expert.data(), impl_->expert.data(), r.expert.size() * 4, cudaMemcpyDeviceToHost, stream));
    TILEMOE_CUDA_CHECK(
        cudaMemcpyAsync(r.weight.data(), impl_->weight.data(), r.weight.size() * 4, cudaMemcpyDeviceToHost, stream));
    impl_->wait(stream, "last_routing");
  }
  return r;
}

}  // namespace tilemoe::cuda
