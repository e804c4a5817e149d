// How long the GPU takes to compile a step's sequential plan from the exchanged counts
// (strategies/sequential/device_compiler.cu), at the expert-parallel benchmark cases' shapes:
// rank 0's plan from every rank's counts of a synthetic routing, timed with events over repeated
// launches on one thread and on a CTA of 256 (a tile per thread), and checked against the host
// compiler's tables for the same counts (the plan of the CTA's last launch).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "moe_cases.hpp"
#include "plan/plan_tables.hpp"
#include "strategies/sequential/device_compiler.hpp"
#include "strategies/sequential/gpu_plan_shape.hpp"
#include "strategies/strategies.hpp"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/synthetic.hpp"

using namespace tilemoe;

int main(int argc, char** argv) {
  try {
    std::vector<std::string> ids;
    for (int i = 1; i < argc; ++i) ids.emplace_back(argv[i]);  // case ids; none: every expert-parallel perf case
    int failures = 0;
    for (const cases::MoeCase& c : cases::select_cases(true, cases::kPerf, ids)) {
      const EpWorld world = c.world(cases::kPerf);
      const SyntheticStep step = synthetic_step(world, c.pattern, 7);
      const std::vector<Routing> routing = route_world(world, step.logits);
      const int W = world.world_size(), E = static_cast<int>(world.layer.num_experts), L = E / W;
      const plan_detail::HostStepCounts counts = plan_detail::routing_counts(routing, E);
      int max_rows = 0;
      for (int d = 0; d < W; ++d) max_rows = std::max(max_rows, counts.view().expert_rows(d));

      const plan_detail::SequentialShape shape = plan_detail::gpu_sequential_shape(world.layer, 0, world.tokens_per_rank[0]);
      const plan_detail::PlanCapacity room = plan_detail::sequential_capacity(W, L, max_rows, shape.tokens, shape);
      cuda::DevicePlanTables tables(room, W, E);
      cuda::DeviceArray<int> device_counts(counts.counts().data(), counts.counts().size());
      cudaStream_t stream = nullptr;
      TILEMOE_CUDA_CHECK(cudaStreamCreate(&stream));
      cudaEvent_t start = nullptr, stop = nullptr;
      TILEMOE_CUDA_CHECK(cudaEventCreate(&start));
      TILEMOE_CUDA_CHECK(cudaEventCreate(&stop));
      // one thread against a CTA of 256 (a tile per thread)
      double us[2] = {0, 0};
      const int widths[2] = {1, 256};
      for (int w = 0; w < 2; ++w) {
        cuda::launch_compile_sequential(stream, device_counts.data(), nullptr, shape, tables, widths[w]);  // warm-up
        constexpr int kRuns = 50;
        TILEMOE_CUDA_CHECK(cudaEventRecord(start, stream));
        for (int i = 0; i < kRuns; ++i) cuda::launch_compile_sequential(stream, device_counts.data(), nullptr, shape, tables, widths[w]);
        TILEMOE_CUDA_CHECK(cudaEventRecord(stop, stream));
        TILEMOE_CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        TILEMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        us[w] = 1000.0 * ms / kRuns;
      }
      StepPlan device_plan;
      device_plan.rank = 0;
      tables.download(stream, [&](const char*) { TILEMOE_CUDA_CHECK(cudaStreamSynchronize(stream)); }, device_plan);
      const StepPlan host_plan = plan_detail::compile_sequential_at(world, routing, PlanOptions{}, shape)[0];
      const std::string difference = plan_detail::first_table_difference(device_plan, host_plan);
      if (!difference.empty()) ++failures;
      std::printf("%-22s %d ranks: %6zu tiles %5zu segments %4zu combines: %8.1f us per compile on one thread, %7.1f us on 256; %s\n",
                  c.id().c_str(), W, device_plan.tiles.size(), device_plan.segments.size(), device_plan.combines.size(), us[0], us[1],
                  difference.empty() ? "equal to the host compiler's" : ("DIFFERS: " + difference).c_str());
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
      cudaStreamDestroy(stream);
    }
    return failures == 0 ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "device_plan_bench: %s\n", e.what());
    return e.kind() == ErrorKind::BadInput ? 2 : 1;
  }
}
