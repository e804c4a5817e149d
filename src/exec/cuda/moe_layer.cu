#include "tilemoe/cuda/moe_layer.hpp"

#include <climits>
#include <cmath>
#include <vector>

#include "cuda_check.hpp"
#include "device_array.hpp"
#include "grouped_gemm.hpp"
#include "planned_gemm.hpp"
#include "moe_kernels.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

// Measured on the H200 (BENCHMARKS.md: every configuration timed on the same rows at the three
// benchmark shapes x 512/4096/16384 tokens). Cooperative 128x256 with a 1x2 cluster won in most
// cases; the 2x1 cluster won with many rows per expert and a short ffn (Qwen3-like at 16384
// tokens: 1024 rows per expert, ffn 768); pingpong 64x256 won only with <= 64 rows per expert
// (4-6%), where a 128-row tile is mostly empty; elsewhere its 64-row tiles read every weight
// tile twice and lost by up to 2x. 256x128 tiles never won.
GemmConfig pick_config(const MoeConfig& c) {
  const double rows_per_expert = static_cast<double>(c.tokens * c.top_k) / static_cast<double>(c.num_experts);
  if (rows_per_expert <= 64) return GemmConfig::Pingpong64x256Cluster1x2;
  if (rows_per_expert >= 1024 && c.ffn_hidden <= 2048) return GemmConfig::Coop128x256Cluster2x1;
  return GemmConfig::Coop128x256Cluster1x2;
}

// The planned GEMM has 128 x 256 tiles only; the cluster follows the same measurements.
PlannedCluster pick_planned_cluster(const MoeConfig& c) {
  return pick_config(c) == GemmConfig::Coop128x256Cluster2x1 ? PlannedCluster::M2 : PlannedCluster::N2;
}

__nv_bfloat16 to_bf16(float v) { return __float2bfloat16_rn(v); }

}  // namespace

struct MoeLayer::Impl {
  MoeConfig config;
  int device = 0;
  bool gelu = false;
  std::int64_t gemm0_n = 0;  // 2 * ffn (gate/up interleaved) for SwiGLU, ffn for GELU
  DeviceArray<__nv_bfloat16> w0, w2;  // [E][gemm0_n][hidden], [E][hidden][ffn]
  DeviceArray<std::int32_t> expert, sorted_expert;
  DeviceArray<float> weight;
  DeviceArray<int> row_offset, slot_of_row, row_of_slot, error_token;
  DeviceArray<char> layout_temp;
  std::size_t layout_temp_bytes = 0;
  DeviceArray<__nv_bfloat16> rows, h, act, y;
  MoeLayerOptions options;
  std::unique_ptr<GroupedGemm> gemm0, gemm1;           // GemmPath::Stock
  std::unique_ptr<PlannedGemm> planned0, planned1;     // GemmPath::Planned
  DeviceArray<GemmTileEntry> table0, table1;
  DeviceArray<int> table_count;                        // [2]: entries of table0, table1
  int table0_capacity = 0, table1_capacity = 0;

  void init(const MoeConfig& c, int dev, MoeLayerOptions opts);
};

MoeLayer::MoeLayer(const MoeConfig& config, RandomDeviceWeights weights, int device, MoeLayerOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->init(config, device, options);
  Impl& m = *impl_;
  const std::int64_t H = config.hidden, F = config.ffn_hidden;
  launch_random_bf16(nullptr, m.w0.data(), m.w0.count(), weights.seed, std::sqrt(3.0f / static_cast<float>(H)));
  launch_random_bf16(nullptr, m.w2.data(), m.w2.count(), weights.seed + 1, std::sqrt(3.0f / static_cast<float>(F)));
  TILEMOE_CUDA_CHECK(cudaDeviceSynchronize());
}

void MoeLayer::Impl::init(const MoeConfig& c, int dev, MoeLayerOptions opts) {
  validate(c);
  if (c.dtype != DType::BF16) throw_bad_input("the CUDA backend stores bf16 only: use --dtype bf16");
  if (c.capacity_factor != 0.0) throw_bad_input("the CUDA backend is dropless only: use --capacity-factor 0");
  if (c.num_experts > 1024) throw_bad_input("the CUDA router handles at most 1024 experts");
  config = c;
  device = dev;
  options = opts;
  gelu = c.activation == Activation::GELU;
  TILEMOE_CUDA_CHECK(cudaSetDevice(device));
  const std::int64_t E = c.num_experts, H = c.hidden, F = c.ffn_hidden;
  gemm0_n = gelu ? F : 2 * F;
  w0 = DeviceArray<__nv_bfloat16>(static_cast<std::size_t>(E * gemm0_n * H));
  w2 = DeviceArray<__nv_bfloat16>(static_cast<std::size_t>(E * H * F));
  const auto slots = static_cast<std::size_t>(c.tokens * c.top_k);
  const std::size_t slot_room = slots > 0 ? slots : 1;
  expert = DeviceArray<std::int32_t>(slot_room);
  sorted_expert = DeviceArray<std::int32_t>(slot_room);
  weight = DeviceArray<float>(slot_room);
  row_offset = DeviceArray<int>(static_cast<std::size_t>(E + 1));
  slot_of_row = DeviceArray<int>(slot_room);
  row_of_slot = DeviceArray<int>(slot_room);
  error_token = DeviceArray<int>(1);
  layout_temp_bytes = tilemoe::cuda::layout_temp_bytes(static_cast<int>(slot_room), static_cast<int>(E));
  layout_temp = DeviceArray<char>(layout_temp_bytes);
  rows = DeviceArray<__nv_bfloat16>(slot_room * static_cast<std::size_t>(H));
  act = DeviceArray<__nv_bfloat16>(slot_room * static_cast<std::size_t>(F));
  y = DeviceArray<__nv_bfloat16>(slot_room * static_cast<std::size_t>(H));
  if (options.gemm == GemmPath::Stock) {
    h = DeviceArray<__nv_bfloat16>(slot_room * static_cast<std::size_t>(gemm0_n));
    const GemmConfig gemm_config = pick_config(c);
    gemm0 = std::make_unique<GroupedGemm>(gemm_config, static_cast<int>(E), device);
    gemm1 = std::make_unique<GroupedGemm>(gemm_config, static_cast<int>(E), device);
    return;
  }
  const PlannedCluster cluster = pick_planned_cluster(c);
  const std::int64_t cap0 = max_tile_entries(static_cast<std::int64_t>(slots), static_cast<int>(E), static_cast<int>(gemm0_n), cluster);
  const std::int64_t cap1 = max_tile_entries(static_cast<std::int64_t>(slots), static_cast<int>(E), static_cast<int>(H), cluster);
  if (cap0 > INT_MAX || cap1 > INT_MAX) throw_bad_input("the layer is too large for one tile table");
  table0_capacity = static_cast<int>(cap0);
  table1_capacity = static_cast<int>(cap1);
  table0 = DeviceArray<GemmTileEntry>(static_cast<std::size_t>(cap0));
  table1 = DeviceArray<GemmTileEntry>(static_cast<std::size_t>(cap1));
  table_count = DeviceArray<int>(2);
  planned0 = std::make_unique<PlannedGemm>(cluster, gelu ? PlannedEpilogue::GELU : PlannedEpilogue::SwiGLU, static_cast<int>(E), device);
  planned1 = std::make_unique<PlannedGemm>(cluster, PlannedEpilogue::Store, static_cast<int>(E), device);
}

MoeLayer::MoeLayer(const MoeConfig& config, const ExpertWeights& weights, int device, MoeLayerOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (weights.hidden != config.hidden || weights.ffn_hidden != config.ffn_hidden ||
      weights.num_experts != config.num_experts || weights.activation != config.activation) {
    throw_bad_input("the expert weights do not match the layer config");
  }
  impl_->init(config, device, options);
  Impl& m = *impl_;
  const std::int64_t E = config.num_experts, H = config.hidden, F = config.ffn_hidden;

  // weights in the nn.Linear layout [out][in], gate and up rows interleaved for SwiGLU
  std::vector<__nv_bfloat16> w0(static_cast<std::size_t>(E * m.gemm0_n * H)), w2(static_cast<std::size_t>(E * H * F));
  for (std::int64_t e = 0; e < E; ++e) {
    for (std::int64_t f = 0; f < F; ++f) {
      for (std::int64_t i = 0; i < H; ++i) {
        const std::size_t in = static_cast<std::size_t>(i * F + f);
        if (m.gelu) {
          w0[static_cast<std::size_t>((e * F + f) * H + i)] = to_bf16(weights.gate(e)[in]);
        } else {
          w0[static_cast<std::size_t>((e * 2 * F + 2 * f) * H + i)] = to_bf16(weights.gate(e)[in]);
          w0[static_cast<std::size_t>((e * 2 * F + 2 * f + 1) * H + i)] = to_bf16(weights.up(e)[in]);
        }
      }
    }
    for (std::int64_t o = 0; o < H; ++o) {
      for (std::int64_t f = 0; f < F; ++f) {
        w2[static_cast<std::size_t>((e * H + o) * F + f)] = to_bf16(weights.down(e)[static_cast<std::size_t>(f * H + o)]);
      }
    }
  }
  TILEMOE_CUDA_CHECK(cudaMemcpy(m.w0.data(), w0.data(), w0.size() * 2, cudaMemcpyHostToDevice));
  TILEMOE_CUDA_CHECK(cudaMemcpy(m.w2.data(), w2.data(), w2.size() * 2, cudaMemcpyHostToDevice));
}

MoeLayer::~MoeLayer() = default;

const MoeConfig& MoeLayer::config() const { return impl_->config; }

std::string MoeLayer::gemm_description() const {
  const Impl& m = *impl_;
  if (m.options.gemm == GemmPath::Planned) return std::string("planned ") + planned_cluster_name(m.planned0->cluster());
  return std::string("stock ") + gemm_config_name(m.gemm0->config());
}

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
  TILEMOE_CUDA_CHECK(cudaSetDevice(m.device));
  const int T = static_cast<int>(tokens), E = static_cast<int>(c.num_experts), k = static_cast<int>(c.top_k);
  const int H = static_cast<int>(c.hidden), F = static_cast<int>(c.ffn_hidden);
  const int slots = T * k;
  auto mark = [&](int stage) {
    if (events) TILEMOE_CUDA_CHECK(cudaEventRecord(events->boundary[stage], stream));
  };
  mark(kRouter);
  launch_fill(stream, m.error_token.data(), 1, INT_MAX);
  launch_router(stream, router_logits, T, E, k, c.renormalize, m.expert.data(), m.weight.data(), m.error_token.data());
  mark(kLayout);
  launch_layout(stream, m.expert.data(), slots, E, m.layout_temp.data(), m.layout_temp_bytes, m.sorted_expert.data(),
                m.row_offset.data(), m.slot_of_row.data(), m.row_of_slot.data());
  const bool planned = m.options.gemm == GemmPath::Planned;
  if (planned) {
    const PlannedCluster cluster = m.planned0->cluster();
    launch_build_tile_table(stream, m.row_offset.data(), E, static_cast<int>(m.gemm0_n), cluster, TileFlags::None,
                            m.table0.data(), m.table0_capacity, m.table_count.data());
    launch_build_tile_table(stream, m.row_offset.data(), E, H, cluster, TileFlags::None, m.table1.data(),
                            m.table1_capacity, m.table_count.data() + 1);
  }
  mark(kPermute);
  launch_permute(stream, input, H, k, m.slot_of_row.data(), slots, m.rows.data());
  mark(kGemm0);
  if (planned) {
    PlannedGemmRun r;
    r.table = m.table0.data();
    r.count = m.table_count.data();
    r.A = m.rows.data();
    r.a_rows = slots;
    r.B = m.w0.data();
    r.groups = E;
    r.D = m.act.data();  // the activation is fused: GEMM0 writes act directly
    r.N = static_cast<int>(m.gemm0_n);
    r.K = H;
    m.planned0->run(stream, r);
  } else {
    m.gemm0->run(stream, E, m.row_offset.data(), m.rows.data(), m.w0.data(), m.h.data(), static_cast<int>(m.gemm0_n), H);
  }
  mark(kActivation);
  if (!planned) launch_activation(stream, m.h.data(), slots, F, m.gelu, m.act.data());
  mark(kGemm1);
  if (planned) {
    PlannedGemmRun r;
    r.table = m.table1.data();
    r.count = m.table_count.data() + 1;
    r.A = m.act.data();
    r.a_rows = slots;
    r.B = m.w2.data();
    r.groups = E;
    r.D = m.y.data();
    r.N = H;
    r.K = F;
    m.planned1->run(stream, r);
  } else {
    m.gemm1->run(stream, E, m.row_offset.data(), m.act.data(), m.w2.data(), m.y.data(), H, F);
  }
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
const __nv_bfloat16* MoeLayer::expert_weights0() const { return impl_->w0.data(); }
const __nv_bfloat16* MoeLayer::expert_weights2() const { return impl_->w2.data(); }

void MoeLayer::check(cudaStream_t stream) {
  TILEMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  int bad = INT_MAX;
  TILEMOE_CUDA_CHECK(cudaMemcpy(&bad, impl_->error_token.data(), sizeof bad, cudaMemcpyDeviceToHost));
  if (bad != INT_MAX) {
    throw_bad_input("token " + std::to_string(bad) + ": a router logit is NaN or infinite; the router produced invalid values");
  }
}

Routing MoeLayer::last_routing(cudaStream_t stream, std::int64_t tokens) const {
  TILEMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  Routing r;
  r.tokens = tokens;
  r.top_k = impl_->config.top_k;
  r.expert.resize(static_cast<std::size_t>(tokens * r.top_k));
  r.weight.resize(r.expert.size());
  r.kept.assign(r.expert.size(), 1);
  if (!r.expert.empty()) {
    TILEMOE_CUDA_CHECK(cudaMemcpy(r.expert.data(), impl_->expert.data(), r.expert.size() * 4, cudaMemcpyDeviceToHost));
    TILEMOE_CUDA_CHECK(cudaMemcpy(r.weight.data(), impl_->weight.data(), r.weight.size() * 4, cudaMemcpyDeviceToHost));
  }
  return r;
}

}  // namespace tilemoe::cuda
