#include "cuda_step.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include "exec/cuda/cuda_check.hpp"
#include "exec/cuda/device_array.hpp"
#include "exec/cuda/layer_timing.hpp"
#include "tilemoe/cuda/moe_layer.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cli {


CudaStepOutput run_cuda_step(const PreparedStep& step) {
  if (step.world.world_size() != 1) {
    throw_bad_input("--backend cuda runs one rank for now: use --ranks 1 (the multi-rank GPU runtime comes next)");
  }
  const MoeConfig config = step.world.rank_config(0);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    throw_bad_input("--backend cuda: no CUDA device is visible on this machine");
  }
  cuda::MoeLayer layer(config, step.weights);
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
  for (int run = 0; run < 2; ++run) {  // the first is the warm-up
    TILEMOE_CUDA_CHECK(cudaMemsetAsync(out.data(), 0xff, input.data.size(), stream));
    TILEMOE_CUDA_CHECK(cudaEventRecord(start, stream));
    layer.forward(stream, x.data(), l.data(), out.data(), config.tokens);
    TILEMOE_CUDA_CHECK(cudaEventRecord(end, stream));
    layer.check(stream);
  }
  float ms = 0;
  TILEMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, end));
  result.forward_ms = ms;
  Matrix output(DType::BF16, config.tokens, config.hidden);
  if (!output.data.empty()) TILEMOE_CUDA_CHECK(cudaMemcpy(output.data.data(), out.data(), output.data.size(), cudaMemcpyDeviceToHost));
  result.outputs.push_back(std::move(output));
  result.routing.push_back(layer.last_routing(stream, config.tokens));
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  cudaStreamDestroy(stream);
  return result;
}

CudaBenchResult run_cuda_bench(const EpWorld& world, RoutingPattern pattern, std::uint64_t seed, int runs) {
  if (world.world_size() != 1) throw_bad_input("--backend cuda benchmarks one rank for now: use --ranks 1");
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    throw_bad_input("--backend cuda: no CUDA device is visible on this machine");
  }
  const MoeConfig config = world.rank_config(0);
  cuda::MoeLayer layer(config, cuda::RandomDeviceWeights{seed});
  const SyntheticStep step = synthetic_step(world, pattern, seed);
  cuda::DeviceArray<float> logits(step.logits[0].data(), step.logits[0].size());
  cudaStream_t stream;
  TILEMOE_CUDA_CHECK(cudaStreamCreate(&stream));
  const cuda::LayerTiming timing = cuda::time_layer_forward(layer, logits.data(), config.tokens, runs, stream);
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
