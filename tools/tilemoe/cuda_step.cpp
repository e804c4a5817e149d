#include "cuda_step.hpp"

#include <cuda_runtime.h>

#include <limits>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>

#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/cuda/device_array.hpp"
#include "tilemoe/cuda/layer_timing.hpp"
#include "tilemoe/cuda/ep_moe_layer.hpp"
#include "tilemoe/launch/launch_env.hpp"
#include "tilemoe/launch/rendezvous.hpp"
#include "tilemoe/cuda/moe_layer.hpp"
#include "tilemoe/cuda/nccl_world.hpp"
#include "tilemoe/cuda/virtual_world.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/memory_estimate.hpp"

namespace tilemoe::cli {


namespace {

// A timeout of the one-GPU layer's bounded wait means a kernel that does not finish: the
// process ends here, message first. Unwinding would free device memory, and cudaFree waits
// for the stalled kernels, so the message would never come.
template <class Work>
auto exit_on_stall(Work&& work) -> decltype(work()) {
  try {
    return work();
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::Timeout) throw;
    std::fprintf(stderr, "tilemoe: %s\n", e.what());
    std::fflush(nullptr);
    std::_Exit(1);
  }
}

void require_device() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    throw_bad_input("--backend cuda: no CUDA device is visible on this machine");
  }
}

// One rank's step: on the world's stream of the rank (with virtual ranks the ranks' kernels wait
// for each other), its buffers allocated before and freed after the world's forwards (cudaFree
// synchronises the whole device). Fills outputs[rank] and routing[rank] of `result`.
void run_rank_step(const PreparedStep& step, const MoeConfig& layer, cuda::RankTransport& transport,
                   const cuda::EpMoeLayerOptions& world_options, int silent_rank, const std::string& how, CudaStepOutput& result,
                   double& forward_ms) {
  const int r = transport.rank();
  const cuda::EpMoeLayerOptions& options = world_options;
  cuda::EpMoeLayerHarness harness;
  harness.silent = r == silent_rank;  // the fault injection: this rank's exchange sends nothing
  const auto ri = static_cast<std::size_t>(r);
  const std::int64_t tokens = step.world.tokens_per_rank[ri];
  const Matrix& input = step.inputs[ri];
  const bool projected = !step.router_gate.empty();  // the layer's router computes the logits from its gate
  transport.bind_thread();
  cudaStream_t stream = transport.stream(cuda::RankStream::Main);  // the world's (rank_transport.hpp says why)
  cudaEvent_t start, end;
  TILEMOE_CUDA_CHECK(cudaEventCreate(&start));
  TILEMOE_CUDA_CHECK(cudaEventCreate(&end));
  {
    cuda::DeviceArray<__nv_bfloat16> x(std::max<std::size_t>(input.data.size() / 2, 8));
    cuda::DeviceArray<float> l(std::max<std::size_t>(step.logits[ri].size(), 1));
    cuda::DeviceArray<__nv_bfloat16> out(std::max<std::size_t>(input.data.size() / 2, 8));
    TILEMOE_CUDA_CHECK(cudaMemcpyAsync(x.data(), input.data.data(), input.data.size(), cudaMemcpyHostToDevice, stream));
    TILEMOE_CUDA_CHECK(cudaMemcpyAsync(l.data(), step.logits[ri].data(), step.logits[ri].size() * 4, cudaMemcpyHostToDevice, stream));
    TILEMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    Strategy ran = Strategy::Sequential;
    {
      cuda::EpMoeLayer ep(layer, step.weights, transport, options, harness);
      ep.set_selection_bias(step.selection_bias);
      if (projected) ep.set_router_gate(step.router_gate, step.router_logits_dtype);
      ran = ep.strategy();
      if (r == 0) result.description = how + ", " + ep.description();
      for (int run = 0; run < 2; ++run) {  // the first is the warm-up
        TILEMOE_CUDA_CHECK(cudaMemsetAsync(out.data(), 0xff, input.data.size(), stream));  // NaN poison
        TILEMOE_CUDA_CHECK(cudaEventRecord(start, stream));
        ep.forward(stream, x.data(), projected ? nullptr : l.data(), out.data(), tokens);
        TILEMOE_CUDA_CHECK(cudaEventRecord(end, stream));
        ep.check(stream);
      }
      float ms = 0;
      TILEMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, end));
      forward_ms = ms;
      Matrix output(DType::BF16, tokens, layer.hidden);
      if (!output.data.empty()) {
        TILEMOE_CUDA_CHECK(cudaMemcpyAsync(output.data.data(), out.data(), output.data.size(), cudaMemcpyDeviceToHost, stream));
      }
      TILEMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
      result.outputs[ri] = std::move(output);
      result.routing[ri] = ep.last_routing(stream, tokens);
      if (options.record_trace) {
        std::vector<DeviceSpan> spans = ep.last_trace(stream);
        static std::mutex spans_mutex;  // ranks are threads with virtual ranks
        std::lock_guard lock(spans_mutex);
        result.spans.insert(result.spans.end(), spans.begin(), spans.end());
      }
      transport.host_barrier();  // nobody builds the next layer while a peer still runs this one
    }  // freed before the sequential layer below is built: the GPU holds one layer at a time
    if (ran != Strategy::Sequential) {
      // an overlap strategy must give the sequential bits: the same step once more, sequential
      cuda::EpMoeLayerOptions plain = options;
      plain.strategy = Strategy::Sequential;
      plain.record_trace = false;
      cuda::EpMoeLayer sequential(layer, step.weights, transport, plain, harness);
      sequential.set_selection_bias(step.selection_bias);
      if (projected) sequential.set_router_gate(step.router_gate, step.router_logits_dtype);
      TILEMOE_CUDA_CHECK(cudaMemsetAsync(out.data(), 0xff, input.data.size(), stream));
      sequential.forward(stream, x.data(), projected ? nullptr : l.data(), out.data(), tokens);
      sequential.check(stream);
      Matrix plain_output(DType::BF16, tokens, layer.hidden);
      if (!plain_output.data.empty()) {
        TILEMOE_CUDA_CHECK(cudaMemcpyAsync(plain_output.data.data(), out.data(), plain_output.data.size(), cudaMemcpyDeviceToHost, stream));
      }
      TILEMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
      result.matches_sequential[ri] = plain_output.bitwise_equal(result.outputs[ri]) ? 1 : 0;
      transport.host_barrier();
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(end);
}

MoeConfig largest_rank_layer(const EpWorld& world) {
  MoeConfig layer = world.layer;
  layer.tokens = *std::max_element(world.tokens_per_rank.begin(), world.tokens_per_rank.end());
  return layer;
}

cuda::EpMoeLayerOptions ep_layer_options(const CudaStepOptions& options) {
  cuda::EpMoeLayerOptions ep_options;
  if (options.dispatch == "device") {
    ep_options.dispatch = cuda::DispatchPath::Device;
  } else if (options.dispatch == "host") {
    ep_options.dispatch = cuda::DispatchPath::Host;
  } else {
    throw_bad_input("unknown --dispatch '" + options.dispatch + "': use device or host");
  }
  ep_options.record_trace = options.trace;
  ep_options.strategy = parse_strategy(options.strategy);
  ep_options.tile_signal = options.tile_signal;
  ep_options.comet = options.comet;
  ep_options.dispatch_volume = options.dispatch_volume;
  return ep_options;
}

CudaStepOutput run_virtual_ranks(const PreparedStep& step, const CudaStepOptions& options) {
  const int ranks = step.world.world_size();
  const MoeConfig layer = largest_rank_layer(step.world);
  const cuda::EpMoeLayerOptions ep_options = ep_layer_options(options);
  cuda::VirtualWorldOptions world_options;
  world_options.timeout = std::chrono::milliseconds(options.timeout_ms);
  world_options.link_gbps = options.link_gbps;
  world_options.sms_per_rank = options.sms_per_rank;
  cuda::VirtualWorld world(ranks, cuda::EpMoeLayer::region_bytes(layer, ranks, ep_options), 0, world_options);
  CudaStepOutput result;
  result.outputs.resize(static_cast<std::size_t>(ranks));
  result.routing.resize(static_cast<std::size_t>(ranks));
  result.matches_sequential.assign(static_cast<std::size_t>(ranks), -1);
  std::vector<double> forward_ms(static_cast<std::size_t>(ranks), 0.0);
  const std::vector<std::exception_ptr> errors = world.run_ranks([&](cuda::RankTransport& transport) {
    run_rank_step(step, layer, transport, ep_options, options.silent_rank, std::to_string(ranks) + " virtual ranks", result,
                  forward_ms[static_cast<std::size_t>(transport.rank())]);
  });
  // the root cause first: a timeout names the rank that stalled; the others were stopped by it
  for (const auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const Error& error) {
      if (error.kind() == ErrorKind::Timeout || error.kind() == ErrorKind::BadInput) throw;
    } catch (...) {
    }
  }
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  result.forward_ms = *std::max_element(forward_ms.begin(), forward_ms.end());
  return result;
}

// What a rank shares with the others after its step, so that every rank checks the whole
// world: its forward time, routing (expert ids, weights) and output.
std::vector<std::byte> pack_rank_result(double forward_ms, const Routing& routing, const Matrix& output) {
  std::vector<std::byte> bytes(sizeof(double) + routing.expert.size() * 8 + output.data.size());
  std::byte* at = bytes.data();
  std::memcpy(at, &forward_ms, sizeof forward_ms);
  at += sizeof forward_ms;
  std::memcpy(at, routing.expert.data(), routing.expert.size() * 4);
  at += routing.expert.size() * 4;
  std::memcpy(at, routing.weight.data(), routing.weight.size() * 4);
  at += routing.weight.size() * 4;
  std::memcpy(at, output.data.data(), output.data.size());
  return bytes;
}

// One rank of a multi-process world (one process per GPU, started by a launcher).
CudaStepOutput run_nccl_rank(const PreparedStep& step, const CudaStepOptions& options) {
  const launch::LaunchEnv env = launch::launch_env();
  const int ranks = step.world.world_size();
  if (env.world_size != ranks) {
    throw_bad_input("--transport nccl runs one rank per process: --ranks is " + std::to_string(ranks) + " but " + env.source +
                    " started " + std::to_string(env.world_size) + " process(es) (e.g. tilemoe launch -n " + std::to_string(ranks) +
                    " -- tilemoe run ...)");
  }
  int devices = 0;
  TILEMOE_CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (env.local_size > devices) {
    throw_bad_input(std::to_string(env.local_size) + " ranks on this node but " + std::to_string(devices) +
                    " GPU(s): NCCL needs one GPU per rank (virtual ranks share one: --transport virtual)");
  }
  cuda::NcclWorld::check_environment();  // before anything starts NCCL
  const MoeConfig layer = largest_rank_layer(step.world);
  const cuda::EpMoeLayerOptions ep_options = ep_layer_options(options);
  const auto timeout = std::chrono::milliseconds(options.timeout_ms);
  launch::Rendezvous rendezvous(env, env.rendezvous, timeout);
  const bool remote_peers = env.local_size < env.world_size;  // several nodes: GIN reads the rows it sends from the region
  cuda::NcclWorld world(rendezvous, cuda::EpMoeLayer::region_bytes(layer, ranks, ep_options, remote_peers), env.local_rank, {timeout});
  CudaStepOutput result;
  result.outputs.resize(static_cast<std::size_t>(ranks));
  result.routing.resize(static_cast<std::size_t>(ranks));
  result.matches_sequential.assign(static_cast<std::size_t>(ranks), -1);
  double forward_ms = 0;
  const std::string how = std::to_string(ranks) + " rank(s) through NCCL " + cuda::NcclWorld::loaded_version() + " (" + env.source + ")";
  run_rank_step(step, layer, world.transport(), ep_options, options.silent_rank, how, result, forward_ms);
  const auto me = static_cast<std::size_t>(env.rank);
  const auto shared = rendezvous.all_gather(pack_rank_result(forward_ms, result.routing[me], result.outputs[me]));
  for (int r = 0; r < ranks; ++r) {
    const auto ri = static_cast<std::size_t>(r);
    const std::int64_t tokens = step.world.tokens_per_rank[ri];
    Routing& routing = result.routing[ri];
    routing.tokens = tokens;
    routing.top_k = layer.top_k;
    const auto slots = static_cast<std::size_t>(tokens * layer.top_k);
    routing.expert.resize(slots);
    routing.weight.resize(slots);
    routing.kept.assign(slots, 1);
    Matrix output(DType::BF16, tokens, layer.hidden);
    const std::vector<std::byte>& bytes = shared[ri];
    if (bytes.size() != sizeof(double) + slots * 8 + output.data.size()) {
      throw_internal("rank " + std::to_string(r) + " shared a result of " + std::to_string(bytes.size()) + " bytes");
    }
    const std::byte* at = bytes.data();
    double ms = 0;
    std::memcpy(&ms, at, sizeof ms);
    at += sizeof ms;
    std::memcpy(routing.expert.data(), at, slots * 4);
    at += slots * 4;
    std::memcpy(routing.weight.data(), at, slots * 4);
    at += slots * 4;
    std::memcpy(output.data.data(), at, output.data.size());
    result.outputs[ri] = std::move(output);
    result.forward_ms = std::max(result.forward_ms, ms);
  }
  if (env.rank != 0) result.description = how;
  result.quiet = env.rank != 0;
  return result;
}

}  // namespace

void check_gpu_memory(const EpWorld& world, const CudaStepOptions& options, std::int64_t shared_ffn_hidden) {
  require_device();
  const int ranks = world.world_size();
  const MoeConfig layer = largest_rank_layer(world);
  // a rank's own buffers in run_rank_step: input, logits, output
  const std::size_t io = 2 * std::max<std::size_t>(static_cast<std::size_t>(layer.tokens * layer.hidden), 8) * 2 +
                         std::max<std::size_t>(static_cast<std::size_t>(layer.tokens * layer.num_experts), 1) * 4;
  std::size_t per_rank = 0, region = 0, weights = 0;
  int ranks_here = 1;  // ranks whose memory this process's GPU holds
  const std::size_t gemm0_n = static_cast<std::size_t>(layer.activation == Activation::GELU ? 1 : 2) * layer.ffn_hidden;
  if (ranks == 1 && options.transport == "virtual") {
    per_rank = cuda::MoeLayer::device_bytes(layer, {}, shared_ffn_hidden) + io;
    weights = static_cast<std::size_t>(layer.num_experts) * (gemm0_n + layer.ffn_hidden) * layer.hidden * 2;
  } else {
    const cuda::EpMoeLayerOptions ep_options = ep_layer_options(options);
    if (layer.num_experts % ranks != 0) {
      throw_bad_input(std::to_string(layer.num_experts) + " experts do not divide evenly over " + std::to_string(ranks) +
                      " ranks: use a number of ranks that divides --experts");
    }
    per_rank = cuda::EpMoeLayer::device_bytes(layer, ranks, ep_options, false, shared_ffn_hidden) + io;
    region = cuda::EpMoeLayer::region_bytes(layer, ranks, ep_options);
    weights = static_cast<std::size_t>(layer.num_experts / ranks) * (gemm0_n + layer.ffn_hidden) * layer.hidden * 2;
    if (options.transport == "virtual") ranks_here = ranks;
  }
  const auto saturated = [](std::size_t a, std::size_t b) {
    return b != 0 && a > std::numeric_limits<std::size_t>::max() / b ? std::numeric_limits<std::size_t>::max() : a * b;
  };
  const std::size_t rank_total = per_rank > std::numeric_limits<std::size_t>::max() - region ? std::numeric_limits<std::size_t>::max()
                                                                                              : per_rank + region;
  const std::size_t needed = saturated(rank_total, static_cast<std::size_t>(ranks_here));
  std::size_t free_bytes = 0, total_bytes = 0;
  TILEMOE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (needed <= free_bytes) return;
  const std::string parts = "expert weights " + memory_text(weights) + (region > 0 ? ", exchange region " + memory_text(region) : "") +
                            ", row buffers and tables " + memory_text(per_rank - weights);
  const std::string per = ranks_here > 1 ? " (" + std::to_string(ranks_here) + " virtual ranks on this GPU, " + memory_text(rank_total) +
                                               " each: " + parts + ")"
                                         : " (" + parts + ")";
  throw_bad_input("this step needs about " + memory_text(needed) + " of GPU memory" + per + ", more than the " +
                  memory_text(free_bytes) + " free of the GPU's " + memory_text(total_bytes) +
                  ": use fewer --tokens, a smaller --hidden, --ffn-hidden or --experts" +
                  (ranks_here > 1 ? ", fewer --ranks, or one GPU per rank (--transport nccl)" : ""));
}

CudaStepOutput run_cuda_step(const PreparedStep& step, const CudaStepOptions& options) {
  const int ranks = step.world.world_size();
  if (options.silent_rank < -1 || options.silent_rank >= ranks || (options.silent_rank >= 0 && ranks < 2)) {
    throw_bad_input("--silent-rank " + std::to_string(options.silent_rank) + " names no rank of a world of " + std::to_string(ranks) +
                    " (the fault injection needs --ranks 2 or more)");
  }
  require_device();
  if (options.transport == "nccl") return run_nccl_rank(step, options);
  if (options.transport != "virtual") throw_bad_input("unknown --transport '" + options.transport + "': use virtual or nccl");
  if (step.world.world_size() > 1) return run_virtual_ranks(step, options);
  if (options.strategy != "sequential") throw_bad_input("--strategy " + options.strategy + " overlaps communication: use --ranks 2 or more");
  if (options.trace) throw_bad_input("--backend cuda writes device traces of expert-parallel steps: use --ranks 2 or more");
  const MoeConfig config = step.world.rank_config(0);
  cuda::MoeLayer layer(config, step.weights);
  layer.set_selection_bias(step.selection_bias);
  const bool projected = !step.router_gate.empty();  // the layer's router computes the logits from its gate
  if (projected) layer.set_router_gate(step.router_gate, step.router_logits_dtype);
  const Matrix& input = step.inputs[0];
  const std::vector<float>& logits = step.logits[0];
  cuda::DeviceArray<__nv_bfloat16> x(input.data.data(), input.data.size() / 2);
  cuda::DeviceArray<float> l(logits.data(), logits.size());
  cuda::DeviceArray<__nv_bfloat16> out(std::max<std::size_t>(input.data.size() / 2, 8));
  cudaStream_t stream;
  TILEMOE_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaEvent_t start, end;
  TILEMOE_CUDA_CHECK(cudaEventCreate(&start));
  TILEMOE_CUDA_CHECK(cudaEventCreate(&end));
  CudaStepOutput result;
  result.description = "1 rank, " + layer.gemm_description();
  for (int run = 0; run < 2; ++run) {  // the first is the warm-up
    TILEMOE_CUDA_CHECK(cudaMemsetAsync(out.data(), 0xff, input.data.size(), stream));
    TILEMOE_CUDA_CHECK(cudaEventRecord(start, stream));
    layer.forward(stream, x.data(), projected ? nullptr : l.data(), out.data(), config.tokens);
    TILEMOE_CUDA_CHECK(cudaEventRecord(end, stream));
    exit_on_stall([&] { layer.check(stream); });
  }
  float ms = 0;
  TILEMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, end));
  result.forward_ms = ms;
  Matrix output(DType::BF16, config.tokens, config.hidden);
  if (!output.data.empty()) TILEMOE_CUDA_CHECK(cudaMemcpy(output.data.data(), out.data(), output.data.size(), cudaMemcpyDeviceToHost));
  result.outputs.push_back(std::move(output));
  result.routing.push_back(exit_on_stall([&] { return layer.last_routing(stream, config.tokens); }));
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  cudaStreamDestroy(stream);
  return result;
}

CudaBenchResult run_cuda_bench(const EpWorld& world, RoutingPattern pattern, std::uint64_t seed, int runs) {
  if (world.world_size() != 1) {
    throw_bad_input("tilemoe bench --backend cuda times one rank: use --ranks 1 (ep_exchange_bench times virtual ranks)");
  }
  require_device();
  const MoeConfig config = world.rank_config(0);
  cuda::MoeLayer layer(config, cuda::RandomDeviceWeights{seed});
  const SyntheticStep step = synthetic_step(world, pattern, seed);
  cuda::DeviceArray<float> logits(step.logits[0].data(), step.logits[0].size());
  cudaStream_t stream;
  TILEMOE_CUDA_CHECK(cudaStreamCreate(&stream));
  const cuda::LayerTiming timing =
      exit_on_stall([&] { return cuda::time_layer_forward(layer, logits.data(), config.tokens, runs, stream); });
  TILEMOE_CUDA_CHECK(cudaStreamDestroy(stream));
  static_assert(cuda::kStageCount == 7);
  CudaBenchResult result;
  for (int s = 0; s < cuda::kStageCount; ++s) {
    result.stage_ms[s] = timing.stage_ms[s];
    result.stage_names[s] = cuda::stage_name(s);
  }
  result.total_ms = timing.total_ms;
  return result;
}

}  // namespace tilemoe::cli
