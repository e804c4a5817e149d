#include "expert_ffn.hpp"

#include <climits>
#include <cmath>
#include <vector>

#include "core/cuda/current_device.hpp"
#include "tilemoe/cuda/cuda_check.hpp"
#include "kernels/gemm/stock/grouped_gemm.hpp"
#include "kernels/moe_kernels.hpp"
#include "kernels/gemm/planned/planned_gemm.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

// Measured on the H200 (BENCHMARKS.md: every configuration timed on the same rows at the three
// benchmark shapes x 512/4096/16384 tokens). Cooperative 128x256 with a 1x2 cluster won in most
// cases; the 2x1 cluster won with many rows per expert and a short ffn (Qwen3-like at 16384
// tokens: 1024 rows per expert, ffn 768); pingpong 64x256 won only with <= 64 rows per expert
// (4-6%), where a 128-row tile is mostly empty; elsewhere its 64-row tiles read every weight
// tile twice and lost by up to 2x. 256x128 tiles never won.
GemmConfig pick_config(double rows_per_expert, std::int64_t ffn) {
  if (rows_per_expert <= 64) return GemmConfig::Pingpong64x256Cluster1x2;
  if (rows_per_expert >= 1024 && ffn <= 2048) return GemmConfig::Coop128x256Cluster2x1;
  return GemmConfig::Coop128x256Cluster1x2;
}

__nv_bfloat16 to_bf16(float v) { return __float2bfloat16_rn(v); }

}  // namespace

struct ExpertFfn::Impl {
  MoeConfig layer;
  std::int64_t first = 0, experts = 0, max_rows = 0;
  GemmPath path = GemmPath::Planned;
  int device = 0;
  bool gelu = false;
  std::int64_t gemm0_n = 0;  // 2 * ffn (gate/up interleaved) for SwiGLU, ffn for GELU
  int checked_rows(std::int64_t rows_bound) const;  // rows_bound within max_rows
  // One planned GEMM over the local experts: the plan's tiles of GEMM `layer`, A's rows times
  // each expert's B (N x K) into D.
  PlannedGemmRun planned_run(int layer, const __nv_bfloat16* A, int a_rows, const __nv_bfloat16* B, __nv_bfloat16* D, int N,
                             int K) const {
    PlannedGemmRun r;
    r.plan = options.plan;
    r.plan_layer = layer;
    const DeviceArray<float>& bias = layer == 0 ? bias0 : bias1;
    r.bias = bias.count() > 0 ? bias.data() : nullptr;
    if (layer == 0) r.swiglu = this->layer.swiglu;
    r.A = A;
    r.a_rows = a_rows;
    r.B = B;
    r.groups = static_cast<int>(experts);
    r.D = D;
    r.N = N;
    r.K = K;
    return r;
  }
  DeviceArray<__nv_bfloat16> h, act;
  DeviceArray<float> bias0, bias1;  // the experts' biases (GPT-OSS), as the planned GEMMs add them: [experts][gemm0_n], [experts][hidden]
  std::unique_ptr<GroupedGemm> gemm0, gemm1;        // GemmPath::Stock
  std::unique_ptr<PlannedGemm> planned0, planned1;  // GemmPath::Planned
  ExpertFfnOptions options;
};

ExpertFfn::ExpertFfn(const MoeConfig& layer, std::int64_t first_expert, std::int64_t experts, std::int64_t max_rows,
                     double rows_per_expert, GemmPath path, int device, ExpertFfnOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (experts < 1 || first_expert < 0 || first_expert + experts > layer.num_experts) {
    throw_bad_input("experts [" + std::to_string(first_expert) + ", " + std::to_string(first_expert + experts) +
                    ") are not experts of a layer of " + std::to_string(layer.num_experts));
  }
  if (max_rows > INT_MAX / 2) throw_bad_input("too many rows for one expert GEMM: " + std::to_string(max_rows));
  m.layer = layer;
  m.first = first_expert;
  m.experts = experts;
  m.max_rows = max_rows;
  m.path = path;
  m.device = device;
  m.options = options;
  if (path == GemmPath::Stock && (options.gemm0_sm_limit > 0 || options.gemm1_sm_limit > 0)) {
    throw_bad_input("the overlap strategies need the planned GEMM (its tile table and flags)");
  }
  if (path == GemmPath::Planned && options.plan == nullptr) throw_internal("the planned GEMMs walk a plan, and none was given");
  if (path == GemmPath::Stock && !layer.swiglu.is_default()) {
    throw_bad_input("GPT-OSS's clamped SwiGLU runs in the planned GEMM's epilogue: use the planned GEMM");
  }
  m.gelu = layer.activation == Activation::GELU;
  const std::int64_t H = layer.hidden, F = layer.ffn_hidden;
  m.gemm0_n = m.gelu ? F : 2 * F;
  use_device(device);
  w0_ = DeviceArray<__nv_bfloat16>(static_cast<std::size_t>(experts * m.gemm0_n * H));
  w2_ = DeviceArray<__nv_bfloat16>(static_cast<std::size_t>(experts * H * F));
  const auto row_room = static_cast<std::size_t>(max_rows > 0 ? max_rows : 1);
  m.act = DeviceArray<__nv_bfloat16>(row_room * static_cast<std::size_t>(F));
  if (path == GemmPath::Stock) {
    const GemmConfig config = pick_config(rows_per_expert, F);
    m.h = DeviceArray<__nv_bfloat16>(row_room * static_cast<std::size_t>(m.gemm0_n));
    m.gemm0 = std::make_unique<GroupedGemm>(config, static_cast<int>(experts), device);
    m.gemm1 = std::make_unique<GroupedGemm>(config, static_cast<int>(experts), device);
    return;
  }
  // The planned GEMM has 128 x 256 tiles only, always on a 1x2 cluster. The stock kernels'
  // rule above picks 2x1 at Qwen3-like shapes (>= 1024 rows per expert, short ffn), but the
  // planned GEMM alone on the same rows was faster on 1x2 there in both calls that timed both
  // (BENCHMARKS.md, second and fourth cut: Qwen3 16384 GEMM0 1.460 vs 1.517 and 1.338 vs 1.470
  // ms).
  const PlannedCluster cluster = PlannedCluster::N2;
  m.planned0 = std::make_unique<PlannedGemm>(cluster, m.gelu ? PlannedEpilogue::GELU : PlannedEpilogue::SwiGLU,
                                             static_cast<int>(experts), device, options.gemm0_sm_limit);
  m.planned1 = std::make_unique<PlannedGemm>(cluster, PlannedEpilogue::Store, static_cast<int>(experts), device,
                                             options.gemm1_sm_limit);
}

ExpertFfn::~ExpertFfn() = default;

DeviceFootprint ExpertFfn::device_bytes(const MoeConfig& layer, std::int64_t experts, std::int64_t max_rows, GemmPath path) {
  const auto H = static_cast<std::size_t>(layer.hidden), F = static_cast<std::size_t>(layer.ffn_hidden);
  const std::size_t gemm0_n = layer.activation == Activation::GELU ? F : 2 * F;
  const auto E = static_cast<std::size_t>(experts);
  const auto row_room = static_cast<std::size_t>(max_rows > 0 ? max_rows : 1);
  DeviceFootprint f;
  f.add(E * gemm0_n * H, sizeof(__nv_bfloat16));  // w0
  f.add(E * H * F, sizeof(__nv_bfloat16));        // w2
  f.add(row_room * F, sizeof(__nv_bfloat16));     // act
  // each GEMM object's own small arrays (per-group pointers and strides, workspace, counter)
  constexpr int kAllocationsPerGemm = 8;
  for (int i = 0; i < 2 * kAllocationsPerGemm; ++i) f.add(1, 1);
  if (path == GemmPath::Stock) f.add(row_room * gemm0_n, sizeof(__nv_bfloat16));  // h
  return f;
}

void ExpertFfn::upload(const ExpertWeights& weights) {
  Impl& m = *impl_;
  check_weights_match(weights, m.layer);
  const std::int64_t H = m.layer.hidden, F = m.layer.ffn_hidden;
  if (weights.has_biases()) {  // GEMM0's in its B's column order (gate and up interleaved for SwiGLU)
    if (m.path == GemmPath::Stock) throw_bad_input("expert biases (GPT-OSS's) are added by the planned GEMM: use the planned GEMM");
    std::vector<float> bias0(static_cast<std::size_t>(m.experts * m.gemm0_n)), bias1(static_cast<std::size_t>(m.experts * H));
    for (std::int64_t le = 0; le < m.experts; ++le) {
      const std::int64_t e = m.first + le;
      for (std::int64_t f = 0; f < F; ++f) {
        const float gate = weights.b1[static_cast<std::size_t>(e * F + f)];
        if (m.gelu) {
          bias0[static_cast<std::size_t>(le * F + f)] = gate;
        } else {
          bias0[static_cast<std::size_t>(le * 2 * F + 2 * f)] = gate;
          bias0[static_cast<std::size_t>(le * 2 * F + 2 * f + 1)] = weights.b3[static_cast<std::size_t>(e * F + f)];
        }
      }
      for (std::int64_t o = 0; o < H; ++o) bias1[static_cast<std::size_t>(le * H + o)] = weights.b2[static_cast<std::size_t>(e * H + o)];
    }
    use_device(m.device);
    m.bias0 = DeviceArray<float>(bias0.data(), bias0.size());
    m.bias1 = DeviceArray<float>(bias1.data(), bias1.size());
  }
  // weights in the nn.Linear layout [out][in], gate and up rows interleaved for SwiGLU
  std::vector<__nv_bfloat16> w0(w0_.count()), w2(w2_.count());
  for (std::int64_t le = 0; le < m.experts; ++le) {
    const std::int64_t e = m.first + le;
    for (std::int64_t f = 0; f < F; ++f) {
      for (std::int64_t i = 0; i < H; ++i) {
        const std::size_t in = static_cast<std::size_t>(i * F + f);
        if (m.gelu) {
          w0[static_cast<std::size_t>((le * F + f) * H + i)] = to_bf16(weights.gate(e)[in]);
        } else {
          w0[static_cast<std::size_t>((le * 2 * F + 2 * f) * H + i)] = to_bf16(weights.gate(e)[in]);
          w0[static_cast<std::size_t>((le * 2 * F + 2 * f + 1) * H + i)] = to_bf16(weights.up(e)[in]);
        }
      }
    }
    for (std::int64_t o = 0; o < H; ++o) {
      for (std::int64_t f = 0; f < F; ++f) {
        w2[static_cast<std::size_t>((le * H + o) * F + f)] = to_bf16(weights.down(e)[static_cast<std::size_t>(f * H + o)]);
      }
    }
  }
  use_device(m.device);
  TILEMOE_CUDA_CHECK(cudaMemcpy(w0_.data(), w0.data(), w0.size() * 2, cudaMemcpyHostToDevice));
  TILEMOE_CUDA_CHECK(cudaMemcpy(w2_.data(), w2.data(), w2.size() * 2, cudaMemcpyHostToDevice));
}

void ExpertFfn::draw(std::uint64_t seed) {
  const Impl& m = *impl_;
  const std::int64_t H = m.layer.hidden, F = m.layer.ffn_hidden;
  use_device(m.device);
  launch_random_bf16(nullptr, w0_.data(), w0_.count(), seed, std::sqrt(3.0f / static_cast<float>(H)),
                     static_cast<std::uint64_t>(m.first * m.gemm0_n * H));
  launch_random_bf16(nullptr, w2_.data(), w2_.count(), seed + 1, std::sqrt(3.0f / static_cast<float>(F)),
                     static_cast<std::uint64_t>(m.first * H * F));
  TILEMOE_CUDA_CHECK(cudaDeviceSynchronize());
}

std::string ExpertFfn::description() const {
  const Impl& m = *impl_;
  if (m.path == GemmPath::Planned) return std::string("planned ") + planned_cluster_name(m.planned0->cluster());
  return std::string("stock ") + gemm_config_name(m.gemm0->config());
}

int ExpertFfn::gemm0_grid_ctas() const { return impl_->planned0 ? impl_->planned0->grid_ctas() : 0; }
int ExpertFfn::gemm1_grid_ctas() const { return impl_->planned1 ? impl_->planned1->grid_ctas() : 0; }

int ExpertFfn::Impl::checked_rows(std::int64_t rows_bound) const {
  if (rows_bound < 0 || rows_bound > max_rows) {
    throw_bad_input("expert GEMM over " + std::to_string(rows_bound) + " rows, sized for " + std::to_string(max_rows));
  }
  return static_cast<int>(rows_bound);
}

void ExpertFfn::run_gemm0(cudaStream_t stream, const int* row_offset, const __nv_bfloat16* rows, std::int64_t rows_bound,
                          const PlannedTileWaits& tile_waits, unsigned long long* gemm0_tile_times) {
  Impl& m = *impl_;
  const int E = static_cast<int>(m.experts), H = static_cast<int>(m.layer.hidden);
  const int a_rows = m.checked_rows(rows_bound);
  if (m.path == GemmPath::Planned) {
    // the activation is fused: GEMM0 writes act directly
    PlannedGemmRun r = m.planned_run(0, rows, a_rows, w0_.data(), m.act.data(), static_cast<int>(m.gemm0_n), H);
    r.tile_waits = tile_waits;
    r.tile_times = gemm0_tile_times;
    m.planned0->run(stream, r);
  } else {
    if (tile_waits.counter_flags > 0) throw_internal("the stock GEMM has no tile waits");
    m.gemm0->run(stream, E, row_offset, rows, w0_.data(), m.h.data(), static_cast<int>(m.gemm0_n), H);
  }
}

void ExpertFfn::run_activation(cudaStream_t stream, std::int64_t rows_bound) {
  Impl& m = *impl_;
  const int a_rows = m.checked_rows(rows_bound);
  if (m.path == GemmPath::Stock) launch_activation(stream, m.h.data(), a_rows, static_cast<int>(m.layer.ffn_hidden), m.gelu, m.act.data());
}

void ExpertFfn::run_gemm1(cudaStream_t stream, const int* row_offset, std::int64_t rows_bound, __nv_bfloat16* y,
                          unsigned* gemm1_flags, int gemm1_flag_offset, unsigned long long* gemm1_tile_times) {
  Impl& m = *impl_;
  const int E = static_cast<int>(m.experts), H = static_cast<int>(m.layer.hidden), F = static_cast<int>(m.layer.ffn_hidden);
  const int a_rows = m.checked_rows(rows_bound);
  if (m.path == GemmPath::Planned) {
    PlannedGemmRun r = m.planned_run(1, m.act.data(), a_rows, w2_.data(), y, H, F);
    r.flags = gemm1_flags;
    r.flag_offset = gemm1_flag_offset;
    r.tile_times = gemm1_tile_times;
    m.planned1->run(stream, r);
  } else {
    m.gemm1->run(stream, E, row_offset, m.act.data(), w2_.data(), y, H, F);
  }
}

}  // namespace tilemoe::cuda
