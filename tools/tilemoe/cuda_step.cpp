#include "cuda_step.hpp"

#include <cuda_runtime.h>

#include "exec/cuda/cuda_check.hpp"
#include "tilemoe/cuda/moe_layer.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cli {

namespace {

template <typename T>
struct DeviceCopy {
  T* data = nullptr;
  DeviceCopy(const void* host, std::size_t bytes) {
    TILEMOE_CUDA_CHECK(cudaMalloc(&data, bytes > 0 ? bytes : 16));
    if (host && bytes) TILEMOE_CUDA_CHECK(cudaMemcpy(data, host, bytes, cudaMemcpyHostToDevice));
  }
  ~DeviceCopy() { cudaFree(data); }
};

}  // namespace

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
  DeviceCopy<__nv_bfloat16> x(input.data.data(), input.data.size());
  DeviceCopy<float> l(logits.data(), logits.size() * sizeof(float));
  DeviceCopy<__nv_bfloat16> out(nullptr, input.data.size());
  cudaStream_t stream;
  TILEMOE_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaEvent_t start, end;
  TILEMOE_CUDA_CHECK(cudaEventCreate(&start));
  TILEMOE_CUDA_CHECK(cudaEventCreate(&end));
  CudaStepOutput result;
  for (int run = 0; run < 2; ++run) {  // the first is the warm-up
    TILEMOE_CUDA_CHECK(cudaMemsetAsync(out.data, 0xff, input.data.size(), stream));
    TILEMOE_CUDA_CHECK(cudaEventRecord(start, stream));
    layer.forward(stream, x.data, l.data, out.data, config.tokens);
    TILEMOE_CUDA_CHECK(cudaEventRecord(end, stream));
    layer.check(stream);
  }
  float ms = 0;
  TILEMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, end));
  result.forward_ms = ms;
  Matrix output(DType::BF16, config.tokens, config.hidden);
  if (!output.data.empty()) TILEMOE_CUDA_CHECK(cudaMemcpy(output.data.data(), out.data, output.data.size(), cudaMemcpyDeviceToHost));
  result.outputs.push_back(std::move(output));
  result.routing.push_back(layer.last_routing(stream, config.tokens));
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  cudaStreamDestroy(stream);
  return result;
}

}  // namespace tilemoe::cli
