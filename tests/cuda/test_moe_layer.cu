// GPU test of the one-GPU MoE layer against the CPU executor and an fp64 reference, on fresh
// random data, outputs poisoned before every run. A plain program (not in ctest: CI has no
// GPU); scripts/device/run.sh runs it. Exit code 0 only if every check passed.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/cuda/bounded_sync.hpp"
#include "gpu_checks.hpp"
#include "moe_cases.hpp"
#include "oracle.hpp"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/cpu_executor.hpp"
#include "tilemoe/cuda/moe_layer.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/reference.hpp"
#include "tilemoe/routing.hpp"
#include "tilemoe/synthetic.hpp"

using namespace tilemoe;

namespace {

using gpu_checks::expect;
// how long a wait for the GPU may take (--wait-limit-s; compute-sanitizer needs minutes)
std::chrono::milliseconds wait_limit{60'000};

template <typename T>
T* device_copy(const void* host, std::size_t bytes) {
  T* p = nullptr;
  TILEMOE_CUDA_CHECK(cudaMalloc(&p, bytes > 0 ? bytes : 16));
  if (bytes) TILEMOE_CUDA_CHECK(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
  return p;
}

// Layer options with the test's wait limit.
cuda::MoeLayerOptions layer_options(std::chrono::milliseconds limit = wait_limit) {
  cuda::MoeLayerOptions options;
  options.wait_limit = limit;
  return options;
}

// Whether check() throws an error of `kind` whose message contains `needle` (printed).
bool check_throws(cuda::MoeLayer& layer, cudaStream_t stream, ErrorKind kind, const char* needle) {
  try {
    layer.check(stream);
  } catch (const Error& e) {
    std::printf("  message: %s\n", e.what());
    return e.kind() == kind && std::strstr(e.what(), needle) != nullptr;
  }
  return false;
}

// A stall ends the test here: unwinding would free the layer's memory, and cudaFree waits for
// the stalled kernels, so the message would never be printed.
[[noreturn]] void exit_on_stall(const std::string& what) {
  std::printf("STALL: %s\n", what.c_str());
  std::fflush(stdout);
  std::_Exit(1);
}

// check(), with its timeout turned into exit_on_stall
void check_or_exit(cuda::MoeLayer& layer, cudaStream_t stream) {
  try {
    layer.check(stream);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::Timeout) exit_on_stall(e.what());
    throw;
  }
}

// A forward with its stage boundaries recorded, waited for at most wait_limit: a stall names
// the first stage that did not finish.
void forward_naming_stalls(cuda::MoeLayer& layer, cudaStream_t stream, const __nv_bfloat16* input, const float* logits,
                           __nv_bfloat16* output, std::int64_t tokens) {
  cuda::StageEvents events{};
  for (cudaEvent_t& e : events.boundary) TILEMOE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  layer.forward(stream, input, logits, output, tokens, &events);
  if (!cuda::wait_for_stream(stream, wait_limit)) {
    // boundary[s] is recorded before stage s: the stall is in the stage before the first
    // boundary not reached (-1: in work queued before the forward)
    int stage = -1;
    while (stage < cuda::kStageCount && cudaEventQuery(events.boundary[stage + 1]) == cudaSuccess) ++stage;
    if (stage < cuda::kStageCount) {  // (all reached: it finished between the two looks)
      exit_on_stall(std::string(stage < 0 ? "work queued before the forward" : "the forward's stage '" +
                                                                              std::string(cuda::stage_name(stage)) + "'") +
                    " did not finish within " + std::to_string(wait_limit.count()) + " ms");
    }
  }
  for (cudaEvent_t e : events.boundary) TILEMOE_CUDA_CHECK(cudaEventDestroy(e));
}

void run_case(const cases::MoeCase& c, std::uint64_t seed) {
  std::printf("%s: T %lld, hidden %lld, ffn %lld, E %lld, top-%lld, %s%s, %s routing\n", c.id().c_str(),
              (long long)c.tokens, (long long)c.hidden, (long long)c.ffn, (long long)c.experts, (long long)c.top_k,
              std::string(activation_name(c.activation)).c_str(), c.renormalize ? ", renormalised" : "",
              std::string(routing_pattern_name(c.pattern)).c_str());
  const EpWorld world = c.world(cases::kTest);
  const SyntheticStep step = synthetic_step(world, c.pattern, seed);
  const ExpertWeights weights = random_weights(world.layer, seed + 1);
  MoeConfig config = world.rank_config(0);

  const cuda::MoeLayerOptions options = layer_options();
  cuda::MoeLayer layer(config, weights, 0, options);
  cudaStream_t stream;
  TILEMOE_CUDA_CHECK(cudaStreamCreate(&stream));
  const std::size_t out_bytes = static_cast<std::size_t>(c.tokens * c.hidden) * 2;
  auto* input = device_copy<__nv_bfloat16>(step.inputs[0].data.data(), step.inputs[0].data.size());
  auto* logits = device_copy<float>(step.logits[0].data(), step.logits[0].size() * 4);
  __nv_bfloat16* output = nullptr;
  TILEMOE_CUDA_CHECK(cudaMalloc(&output, out_bytes > 0 ? out_bytes : 16));

  std::vector<Matrix> runs;
  for (int run = 0; run < 2; ++run) {
    TILEMOE_CUDA_CHECK(cudaMemsetAsync(output, 0xff, out_bytes, stream));  // NaN poison
    forward_naming_stalls(layer, stream, input, logits, output, c.tokens);
    check_or_exit(layer, stream);
    Matrix out(DType::BF16, c.tokens, c.hidden);
    if (out_bytes) TILEMOE_CUDA_CHECK(cudaMemcpy(out.data.data(), output, out_bytes, cudaMemcpyDeviceToHost));
    runs.push_back(std::move(out));
  }
  expect(runs[0].bitwise_equal(runs[1]), "the same inputs give bitwise-identical outputs run after run");

  // the whole forward captured in a CUDA graph (no host sync inside) replays to the same bits
  {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    TILEMOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    layer.forward(stream, input, logits, output, c.tokens);
    TILEMOE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    TILEMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    TILEMOE_CUDA_CHECK(cudaMemsetAsync(output, 0xff, out_bytes, stream));
    TILEMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    check_or_exit(layer, stream);
    Matrix replayed(DType::BF16, c.tokens, c.hidden);
    if (out_bytes) TILEMOE_CUDA_CHECK(cudaMemcpy(replayed.data.data(), output, out_bytes, cudaMemcpyDeviceToHost));
    expect(replayed.bitwise_equal(runs[0]), "a CUDA-graph replay of the forward gives the eager output bitwise");
    TILEMOE_CUDA_CHECK(cudaGraphExecDestroy(exec));
    TILEMOE_CUDA_CHECK(cudaGraphDestroy(graph));
  }

  // the routing kernel against the CPU's
  const Routing gpu_routing = layer.last_routing(stream, c.tokens);
  const Routing cpu_routing = route(config, step.logits[0], 0);
  std::int64_t id_mismatch = 0;
  double weight_diff = 0;
  for (std::size_t s = 0; s < gpu_routing.expert.size(); ++s) {
    id_mismatch += gpu_routing.expert[s] != cpu_routing.expert[s];
    weight_diff = std::max(weight_diff, std::abs(double(gpu_routing.weight[s]) - cpu_routing.weight[s]));
  }
  expect(id_mismatch * 1000 <= static_cast<std::int64_t>(gpu_routing.expert.size()) && weight_diff < 1e-5,
         "router: " + std::to_string(id_mismatch) + " of " + std::to_string(gpu_routing.expert.size()) +
             " expert ids differ from the CPU (near ties only), max weight difference " + std::to_string(weight_diff));

  // the expert path against the CPU executor and fp64, on the GPU's routing
  const std::vector<Routing> routing = {gpu_routing};
  const cases::OracleErrors e = cases::oracle_errors(world, step.inputs, routing, weights, {runs[0]}, c.tolerance);
  expect(e.within_tolerance(), layer.gemm_description() + ": " + e.describe());

  // the stock-kernel path (separate activation kernel, another rounding point) on the same step
  {
    cuda::MoeLayerOptions stock_options = options;
    stock_options.gemm = cuda::GemmPath::Stock;
    cuda::MoeLayer stock(config, weights, 0, stock_options);
    TILEMOE_CUDA_CHECK(cudaMemsetAsync(output, 0xff, out_bytes, stream));
    forward_naming_stalls(stock, stream, input, logits, output, c.tokens);
    check_or_exit(stock, stream);
    Matrix out(DType::BF16, c.tokens, c.hidden);
    if (out_bytes) TILEMOE_CUDA_CHECK(cudaMemcpy(out.data.data(), output, out_bytes, cudaMemcpyDeviceToHost));
    const cases::OracleErrors stock_errors = cases::oracle_errors(world, step.inputs, routing, weights, {out}, c.tolerance);
    expect(stock_errors.within_tolerance(), stock.gemm_description() + ": " + stock_errors.describe());
  }

  cudaFree(input);
  cudaFree(logits);
  cudaFree(output);
  cudaStreamDestroy(stream);
}

MoeConfig small_config(std::int64_t tokens, std::int64_t experts) {
  MoeConfig config;
  config.tokens = tokens;
  config.hidden = 64;
  config.ffn_hidden = 64;
  config.num_experts = experts;
  config.top_k = 2;
  return config;
}

void nan_logits_are_reported() {
  std::printf("NaN logits\n");
  const MoeConfig config = small_config(40, 8);
  const ExpertWeights weights = random_weights(config, 3);
  cuda::MoeLayer layer(config, weights, 0, layer_options());
  std::vector<std::uint16_t> x(40 * 64, 0x3f80);
  std::vector<float> logits(40 * 8, 0.25f);
  logits[17 * 8 + 5] = NAN;
  logits[30 * 8 + 1] = INFINITY;
  auto* input = device_copy<__nv_bfloat16>(x.data(), x.size() * 2);
  auto* d_logits = device_copy<float>(logits.data(), logits.size() * 4);
  __nv_bfloat16* output = nullptr;
  TILEMOE_CUDA_CHECK(cudaMalloc(&output, x.size() * 2));
  layer.forward(nullptr, input, d_logits, output, 40);
  expect(check_throws(layer, nullptr, ErrorKind::BadInput, "token 17"), "a NaN logit is a bad-input error naming the first bad token");
  cudaFree(input);
  cudaFree(d_logits);
  cudaFree(output);
}

// A one-GPU layer's output (device, config.tokens rows) on the GPU's routing against the CPU
// executor and fp64.
cases::OracleErrors one_gpu_oracle(const MoeConfig& config, const Matrix& in, const Routing& gpu, const ExpertWeights& weights,
                                   const __nv_bfloat16* output) {
  Matrix out(DType::BF16, config.tokens, config.hidden);
  TILEMOE_CUDA_CHECK(cudaMemcpy(out.data.data(), output, out.data.size(), cudaMemcpyDeviceToHost));
  EpWorld world;
  world.layer = config;
  world.tokens_per_rank = {config.tokens};
  return cases::oracle_errors(world, {in}, {gpu}, weights, {out}, cases::kBf16Tolerance);
}

// The router's rules of the model families on the GPU against the CPU's route() (the reference,
// include/tilemoe/routing.hpp) on fresh logits, given or projected by the layer's gate (against
// the CPU's router_logits()): the same experts (a choice within rounding of a tie may differ: at
// most 1 in 1000 slots) and weights within 1e-5 of the weights' scale (1e-2 for logits rounded
// to bf16, where a sum in another order may round to the neighbouring bf16); then the layer's
// output against the CPU executor and fp64 on the GPU's routing.
void router_rules_match_the_cpu(std::uint64_t seed) {
  struct Rule {
    const char* name;
    std::int64_t experts, top_k;
    bool renormalize, bias;
    RouterConfig router;
    bool from_gate = false;  // the layer projects the logits (set_router_gate) in logits_dtype
    DType logits_dtype = DType::F32;
  };
  RouterConfig deepseek;  // DeepSeek-V3: sigmoid, the bias to choose, 8 groups / 4 kept, renormalised, scaled
  deepseek.score = ScoreFunction::Sigmoid;
  deepseek.groups = 8;
  deepseek.top_groups = 4;
  deepseek.renormalize_epsilon = 1e-20f;
  deepseek.scaling = 2.5f;
  RouterConfig gpt_oss;  // top-k of the logits, a softmax over the k
  gpt_oss.score = ScoreFunction::Logits;
  gpt_oss.weights = RouterWeights::SoftmaxOfSelected;
  RouterConfig v4;  // DeepSeek-V4's sqrt(softplus), many logits past softplus' threshold
  v4.score = ScoreFunction::SqrtSoftplus;
  v4.scaling = 1.5f;
  RouterConfig grouped_softmax;  // softmax scores in groups, no bias, 1000 experts (32 lanes' worth)
  grouped_softmax.groups = 40;
  grouped_softmax.top_groups = 3;
  const Rule rules[] = {
      {"deepseek-v3 256 experts", 256, 8, true, true, deepseek},
      {"deepseek-v3 64 experts, not renormalised", 64, 6, false, true, deepseek},
      {"gpt-oss", 32, 4, false, false, gpt_oss},
      {"sqrt-softplus, biased", 96, 6, true, true, v4},
      {"softmax in 40 groups", 1000, 8, true, false, grouped_softmax},
      {"deepseek-v3, fp32 logits from the gate", 256, 8, true, true, deepseek, true, DType::F32},
      {"mixtral, bf16 logits from the gate", 8, 2, true, false, RouterConfig{}, true, DType::BF16},
  };
  for (const Rule& rule : rules) {
    std::printf("router rule: %s\n", rule.name);
    MoeConfig config = small_config(300, rule.experts);
    config.top_k = rule.top_k;
    config.renormalize = rule.renormalize;
    config.router = rule.router;
    validate(config);
    std::mt19937 rng(static_cast<unsigned>(seed + static_cast<std::uint64_t>(rule.experts)));
    std::normal_distribution<float> normal(0.0f, rule.router.score == ScoreFunction::SqrtSoftplus ? 12.0f : 2.0f);
    std::vector<float> logits(static_cast<std::size_t>(config.tokens * config.num_experts)), bias;
    for (float& v : logits) v = normal(rng);
    if (rule.bias) {
      std::normal_distribution<float> spread(0.0f, 0.3f);
      for (std::int64_t e = 0; e < config.num_experts; ++e) bias.push_back(spread(rng));
    }
    const ExpertWeights weights = random_weights(config, seed + 7);
    std::vector<std::uint16_t> x(static_cast<std::size_t>(config.tokens * config.hidden));
    std::normal_distribution<float> activation(0.0f, 1.0f);
    for (std::uint16_t& v : x) v = float_to_bf16_bits(activation(rng));
    Matrix in(DType::BF16, config.tokens, config.hidden);
    std::memcpy(in.data.data(), x.data(), in.data.size());
    cuda::MoeLayer layer(config, weights, 0, layer_options());
    layer.set_selection_bias(bias);
    if (rule.from_gate) {  // bf16 gate values, scaled so that the logits spread about as above
      std::vector<float> gate(static_cast<std::size_t>(config.num_experts * config.hidden));
      for (float& g : gate) g = round_to(DType::BF16, normal(rng) / std::sqrt(static_cast<float>(config.hidden)));
      layer.set_router_gate(gate, rule.logits_dtype);
      logits = router_logits(in, gate, config.num_experts, rule.logits_dtype);
    }
    auto* input = device_copy<__nv_bfloat16>(x.data(), x.size() * 2);
    auto* d_logits = device_copy<float>(logits.data(), logits.size() * 4);
    __nv_bfloat16* output = nullptr;
    TILEMOE_CUDA_CHECK(cudaMalloc(&output, x.size() * 2));
    TILEMOE_CUDA_CHECK(cudaMemset(output, 0xff, x.size() * 2));  // NaN poison
    layer.forward(nullptr, input, rule.from_gate ? nullptr : d_logits, output, config.tokens);
    check_or_exit(layer, nullptr);
    const Routing gpu = layer.last_routing(nullptr, config.tokens);
    const Routing cpu = route(config, logits, 0, bias);
    std::int64_t id_mismatch = 0;
    double weight_diff = 0;
    for (std::size_t s = 0; s < gpu.expert.size(); ++s) {
      id_mismatch += gpu.expert[s] != cpu.expert[s];
      if (gpu.expert[s] == cpu.expert[s]) weight_diff = std::max(weight_diff, std::abs(double(gpu.weight[s]) - cpu.weight[s]));
    }
    const double scale = rule.router.scaling, tolerance = rule.from_gate && rule.logits_dtype == DType::BF16 ? 1e-2 : 1e-5;
    expect(id_mismatch * 1000 <= static_cast<std::int64_t>(gpu.expert.size()) && weight_diff <= tolerance * scale,
           std::string(rule.name) + ": " + std::to_string(id_mismatch) + " of " + std::to_string(gpu.expert.size()) +
               " experts differ from the CPU's, weights within " + std::to_string(weight_diff));
    const cases::OracleErrors e = one_gpu_oracle(config, in, gpu, weights, output);
    expect(e.within_tolerance(), std::string(rule.name) + ": the layer's output on the GPU's routing against the CPU executor and fp64 (" +
                                     e.describe() + ")");
    cudaFree(input);
    cudaFree(d_logits);
    cudaFree(output);
  }
}

// A layer that adds to the routing or the experts, on fresh inputs: the GPU's output against
// the CPU executor and fp64 on the GPU's routing, whose kept slots must be those the CPU's rule
// keeps of the GPU's choices (and with `must_drop`, some slot must be dropped).
void layer_variant_matches_the_cpu(const char* what, const MoeConfig& config, const ExpertWeights& weights, std::uint64_t seed,
                                   bool must_drop) {
  std::printf("%s\n", what);
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::uint16_t> x(static_cast<std::size_t>(config.tokens * config.hidden));
  for (std::uint16_t& v : x) v = float_to_bf16_bits(normal(rng));
  std::vector<float> logits(static_cast<std::size_t>(config.tokens * config.num_experts));
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = normal(rng) + (i % config.num_experts < 2 ? 1.5f : 0.0f);  // skewed
  Matrix in(DType::BF16, config.tokens, config.hidden);
  std::memcpy(in.data.data(), x.data(), in.data.size());
  cuda::MoeLayer layer(config, weights, 0, layer_options());
  auto* input = device_copy<__nv_bfloat16>(x.data(), x.size() * 2);
  auto* d_logits = device_copy<float>(logits.data(), logits.size() * 4);
  __nv_bfloat16* output = nullptr;
  TILEMOE_CUDA_CHECK(cudaMalloc(&output, x.size() * 2));
  TILEMOE_CUDA_CHECK(cudaMemset(output, 0xff, x.size() * 2));  // NaN poison
  layer.forward(nullptr, input, d_logits, output, config.tokens);
  check_or_exit(layer, nullptr);
  const Routing gpu = layer.last_routing(nullptr, config.tokens);
  Routing cpu = gpu;
  apply_capacity(config, cpu);
  std::int64_t differ = 0, dropped = 0;
  for (std::size_t s = 0; s < cpu.kept.size(); ++s) {
    differ += cpu.kept[s] != gpu.kept[s];
    dropped += cpu.kept[s] == 0;
  }
  expect(differ == 0 && (dropped > 0 || !must_drop), std::string(what) + ": the GPU keeps the CPU rule's slots (" +
                                                         std::to_string(dropped) + " dropped, " + std::to_string(differ) + " differ)");
  const cases::OracleErrors e = one_gpu_oracle(config, in, gpu, weights, output);
  expect(e.within_tolerance(), std::string(what) + ": the layer's output against the CPU executor and fp64 (" + e.describe() + ")");
  cudaFree(input);
  cudaFree(d_logits);
  cudaFree(output);
}

// Shared experts (DeepSeek's: two of the routed width stored as one, ungated; Qwen2-MoE's: one of
// its own width, gated by a sigmoid; a shared expert the GPU left out would miss the oracle by
// its whole share of the output), the GShard capacity rule (factors that drop some slots and
// that drop none), Llama-4's routing (top-1, the sigmoid weight scaling the expert's input,
// with its ungated shared expert) and GPT-OSS's experts (biases, the clamped SwiGLU).
void layer_variants(std::uint64_t seed) {
  MoeConfig config = small_config(300, 8);
  config.hidden = 256;
  config.ffn_hidden = 128;
  for (const bool gated : {false, true}) {
    ExpertWeights weights = random_weights(config, seed + 11);
    weights.shared = cases::random_shared_expert(config, gated ? 320 : 2 * config.ffn_hidden, gated, seed + 12);
    layer_variant_matches_the_cpu(gated ? "a gated shared expert" : "an ungated shared expert", config, weights, seed + 13, false);
  }
  for (const double factor : {0.5, 1.25, 4.0}) {
    MoeConfig dropping = config;
    dropping.capacity_factor = factor;
    layer_variant_matches_the_cpu(("capacity factor " + std::to_string(factor)).c_str(), dropping, random_weights(dropping, seed + 14),
                                  seed + 15, factor < 4.0);
  }
  MoeConfig llama4 = config;
  llama4.top_k = 1;
  llama4.renormalize = false;
  llama4.router.score = ScoreFunction::Sigmoid;
  llama4.router.scales_input = true;
  ExpertWeights weights = random_weights(llama4, seed + 16);
  weights.shared = cases::random_shared_expert(llama4, llama4.ffn_hidden, false, seed + 17);
  layer_variant_matches_the_cpu("Llama-4's routing: the weight scales the expert's input", llama4, weights, seed + 18, false);
  MoeConfig gpt_oss = config;  // its router (the softmax of the k chosen logits), expert biases, clamped SwiGLU
  gpt_oss.top_k = 4;
  gpt_oss.router.score = ScoreFunction::Logits;
  gpt_oss.router.weights = RouterWeights::SoftmaxOfSelected;
  gpt_oss.swiglu = {7.0f, 1.702f, 1.0f};
  layer_variant_matches_the_cpu("GPT-OSS's experts: biases and the clamped SwiGLU", gpt_oss, cases::biased_weights(gpt_oss, seed + 19),
                                seed + 20, false);
}

// Held by the host: spins until *release is set (or ~20 s pass, so a broken test cannot hang).
__global__ void hold_stream(const volatile int* release) {
  const long long start = clock64();
  while (*release == 0 && clock64() - start < 20LL * 2'000'000'000LL) {
  }
}

// check() waits for the stream at most options.wait_limit: a kernel that does not finish
// becomes a timeout error, not a hang.
void stalled_stream_is_a_timeout() {
  std::printf("a stalled stream\n");
  const MoeConfig config = small_config(16, 4);
  cuda::MoeLayer layer(config, random_weights(config, 5), 0, layer_options(std::chrono::milliseconds(300)));
  int* release = nullptr;
  TILEMOE_CUDA_CHECK(cudaHostAlloc(&release, sizeof(int), cudaHostAllocMapped));
  *release = 0;
  int* device_release = nullptr;
  TILEMOE_CUDA_CHECK(cudaHostGetDevicePointer(&device_release, release, 0));
  cudaStream_t stream;
  TILEMOE_CUDA_CHECK(cudaStreamCreate(&stream));
  hold_stream<<<1, 1, 0, stream>>>(device_release);
  TILEMOE_CUDA_CHECK(cudaGetLastError());
  const auto start = std::chrono::steady_clock::now();
  const bool timed_out = check_throws(layer, stream, ErrorKind::Timeout, "300 ms");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *reinterpret_cast<volatile int*>(release) = 1;
  TILEMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  expect(timed_out && waited >= 0.3 && waited < 5.0, "check() on a stalled stream is a timeout error after the wait limit (waited " +
                                        std::to_string(waited) + " s)");
  TILEMOE_CUDA_CHECK(cudaStreamDestroy(stream));
  TILEMOE_CUDA_CHECK(cudaFreeHost(release));
}

}  // namespace

// MoeLayer::device_bytes, with which the CLI refuses a step too large for the GPU, must never
// count less than a layer takes (cudaMemGetInfo before and after building it), nor much more.
void device_memory_estimate_holds() {
  std::printf("device memory estimate\n");
  for (const MoeConfig& config : {MoeConfig{.tokens = 4096, .hidden = 4096, .ffn_hidden = 4096, .num_experts = 8, .top_k = 2},
                                  MoeConfig{.tokens = 300, .hidden = 512, .ffn_hidden = 768, .num_experts = 16, .top_k = 4}}) {
    TILEMOE_CUDA_CHECK(cudaDeviceSynchronize());
    std::size_t free_before = 0, free_after = 0, total = 0;
    TILEMOE_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
    const std::size_t estimate = cuda::MoeLayer::device_bytes(config);
    {
      cuda::MoeLayer layer(config, cuda::RandomDeviceWeights{5}, 0, layer_options());
      TILEMOE_CUDA_CHECK(cudaDeviceSynchronize());
      TILEMOE_CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
    }
    const std::size_t used = free_before - free_after;
    char text[200];
    std::snprintf(text, sizeof text, "%lld tokens, hidden %lld: estimate %.1f MiB, the layer took %.1f MiB",
                  static_cast<long long>(config.tokens), static_cast<long long>(config.hidden), estimate / 1048576.0,
                  used / 1048576.0);
    // over by at most 10% and the page rounding of its ~45 small arrays (the layer is a world of
    // one: the world's region and records count too; 114 MiB estimated for 44 MiB taken at the
    // small case, H100)
    expect(used <= estimate && estimate <= used + used / 10 + (std::size_t{96} << 20), text);
  }
}

int main(int argc, char** argv) {
  // a run cut by a timeout (compute-sanitizer is slow) must still show how far it got
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // --small: only the small cases, for compute-sanitizer; --case ID (repeatable): those cases of
  // the registry (tests/cases: any one-GPU case, a benchmark's too) or checks only; --list: the
  // cases and checks that would run, one per line (the device script runs each alone);
  // --wait-limit-s S: how long a wait for the GPU may take before a timeout naming the stage
  bool small = false, list = false;
  std::vector<std::string> named;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--small") == 0) {
      small = true;
    } else if (std::strcmp(argv[i], "--list") == 0) {
      list = true;
    } else if (std::strcmp(argv[i], "--case") == 0 && i + 1 < argc) {
      named.emplace_back(argv[++i]);
    } else if (std::strcmp(argv[i], "--wait-limit-s") == 0 && i + 1 < argc) {
      char* end = nullptr;
      const double seconds = std::strtod(argv[++i], &end);
      if (end == argv[i] || *end != '\0' || !(seconds >= 0.001 && seconds <= 3600)) {
        std::fprintf(stderr, "--wait-limit-s: a number of seconds in [0.001, 3600], not '%s'\n", argv[i]);
        return 2;
      }
      wait_limit = std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
    } else {
      std::fprintf(stderr, "usage: %s [--small] [--case ID ...] [--list] [--wait-limit-s S]\n", argv[0]);
      return 2;
    }
  }
  // the checks beside the registry's cases; the memory estimate's is not small
  const std::string nan_check = "nan-logits", stall_check = "stalled-stream", memory_check = "device-memory-estimate",
                    rules_check = "router-rules", shared_check = "layer-variants";
  std::vector<std::string> case_ids, checks;
  for (const std::string& name : named) {
    (name == nan_check || name == stall_check || name == memory_check || name == rules_check || name == shared_check ? checks : case_ids)
        .push_back(name);
  }
  if (named.empty()) {
    checks = {nan_check, rules_check, shared_check, stall_check};
    if (!small) checks.push_back(memory_check);  // (run in a fixed order below, the stall last)
  }
  std::vector<cases::MoeCase> chosen;
  try {
    if (named.empty() || !case_ids.empty()) chosen = cases::select_cases(false, cases::kTest, case_ids);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  if (small) {
    for (const cases::MoeCase& c : chosen) {
      if (!case_ids.empty() && !c.small()) {
        std::fprintf(stderr, "case '%s' is not one of the --small cases\n", c.id().c_str());
        return 2;
      }
    }
    std::erase_if(chosen, [](const cases::MoeCase& c) { return !c.small(); });
  }
  if (list) {
    for (const cases::MoeCase& c : chosen) std::printf("%s\n", c.id().c_str());
    for (const std::string& check : checks) std::printf("%s\n", check.c_str());
    return 0;
  }
  try {
    const auto seed = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::printf("seed %llu (fresh random data every run)\n", static_cast<unsigned long long>(seed));
    for (const cases::MoeCase& c : chosen) {
      const auto start = std::chrono::steady_clock::now();
      run_case(c, seed + 1000 * (cases::registry_place(c) + 1));
      std::printf("  (%.1f s)\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    const auto asked = [&](const std::string& check) { return std::find(checks.begin(), checks.end(), check) != checks.end(); };
    if (asked(nan_check)) nan_logits_are_reported();
    if (asked(rules_check)) router_rules_match_the_cpu(seed);
    if (asked(shared_check)) layer_variants(seed);
    if (asked(memory_check)) device_memory_estimate_holds();
    if (asked(stall_check)) stalled_stream_is_a_timeout();  // last: the stalled kernel may still run
  } catch (const std::exception& e) {
    gpu_checks::fail(std::string("unexpected exception: ") + e.what());
  }
  return gpu_checks::verdict();
}
