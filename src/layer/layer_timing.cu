#include "tilemoe/cuda/layer_timing.hpp"

#include <algorithm>
#include <vector>

#include "tilemoe/cuda/cuda_check.hpp"
#include "kernels/moe_kernels.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/median.hpp"

namespace tilemoe::cuda {

namespace {

constexpr std::size_t kRotationBytes = std::size_t(256) << 20;  // > 4x the H200's 60 MB L2

}  // namespace

LayerTiming time_layer_forward(MoeLayer& layer, const float* logits, std::int64_t tokens, int runs, cudaStream_t stream) {
  if (runs < 1) throw_bad_input("a benchmark needs at least one run");
  const MoeConfig& c = layer.config();
  const std::size_t elems = static_cast<std::size_t>(tokens * c.hidden);
  const std::size_t bytes = std::max<std::size_t>(elems * 2, 16);
  const int rotations = static_cast<int>(std::clamp<std::size_t>(kRotationBytes / bytes + 1, 2, 32));
  std::vector<__nv_bfloat16*> inputs(static_cast<std::size_t>(rotations), nullptr);
  __nv_bfloat16* output = nullptr;
  StageEvents events{};
  LayerTiming timing;
  const auto release = [&] {
    for (auto* p : inputs) cudaFree(p);
    cudaFree(output);
    for (cudaEvent_t e : events.boundary) {
      if (e) cudaEventDestroy(e);
    }
  };
  try {
    for (int r = 0; r < rotations; ++r) {
      TILEMOE_CUDA_CHECK(cudaMalloc(&inputs[static_cast<std::size_t>(r)], bytes));
      launch_random_bf16(stream, inputs[static_cast<std::size_t>(r)], elems, 100 + static_cast<std::uint64_t>(r), 1.0f);
    }
    TILEMOE_CUDA_CHECK(cudaMalloc(&output, bytes));
    for (auto& e : events.boundary) TILEMOE_CUDA_CHECK(cudaEventCreate(&e));
    std::vector<std::vector<double>> stage(kStageCount);
    std::vector<double> total;
    for (int run = 0; run < runs + 3; ++run) {
      layer.forward(stream, inputs[static_cast<std::size_t>(run % rotations)], logits, output, tokens, &events);
      layer.check(stream);
      if (run < 3) continue;
      for (int s = 0; s < kStageCount; ++s) {
        float ms = 0;
        TILEMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, events.boundary[s], events.boundary[s + 1]));
        stage[static_cast<std::size_t>(s)].push_back(ms);
      }
      float ms = 0;
      TILEMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, events.boundary[0], events.boundary[kStageCount]));
      total.push_back(ms);
    }
    for (int s = 0; s < kStageCount; ++s) timing.stage_ms[s] = median(stage[static_cast<std::size_t>(s)]);
    timing.total_ms = median(total);
    timing.runs = runs;
  } catch (const Error& e) {
    // a stalled forward: freeing would wait for it, so the buffers stay for the caller's exit
    if (e.kind() != ErrorKind::Timeout) release();
    throw;
  } catch (...) {
    release();
    throw;
  }
  release();
  return timing;
}

}  // namespace tilemoe::cuda
