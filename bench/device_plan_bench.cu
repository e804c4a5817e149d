// How long the GPU takes to compile a step's plan from the exchanged counts, at the benchmark
// cases' shapes: the sequential plan (strategies/sequential/device_compiler.cu) against the two
// tile-table builds it replaced in a step (GEMM0's and GEMM1's, launch_build_tile_table), and on
// more than one rank tile_signal's (strategies/tile_signal/device_compiler.cu) against the
// tables its GPU schedule builds today (both GEMMs' tables, the remote-first order, the bands).
// Rank 0's plans from every rank's counts of a synthetic routing, each timed with events over
// repeated launches, and each plan checked against the host compiler's for the same counts.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "moe_cases.hpp"
#include "kernels/gemm/planned/planned_gemm.hpp"
#include "plan/plan_tables.hpp"
#include "strategies/sequential/device_compiler.hpp"
#include "strategies/sequential/gpu_plan_shape.hpp"
#include "strategies/tile_signal/defaults.hpp"
#include "strategies/tile_signal/device_compiler.hpp"
#include "strategies/tile_signal/gpu_plan_shape.hpp"
#include "table_schedule.hpp"
#include "strategies/strategies.hpp"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/synthetic.hpp"

using namespace tilemoe;

int main(int argc, char** argv) {
  try {
    std::vector<std::string> ids;
    for (int i = 1; i < argc; ++i) ids.emplace_back(argv[i]);  // case ids; none: every perf case
    int failures = 0;
    // the one-GPU layer's cases (a world of one, every expert local) and the expert-parallel ones
    std::vector<cases::MoeCase> selected = cases::select_cases(false, cases::kPerf, ids);
    for (const cases::MoeCase& c : cases::select_cases(true, cases::kPerf, ids)) selected.push_back(c);
    for (const cases::MoeCase& c : selected) {
      const EpWorld world = c.world(cases::kPerf);
      const SyntheticStep step = synthetic_step(world, c.pattern, 7);
      const std::vector<Routing> routing = route_world(world, step.logits);
      const int W = world.world_size(), E = static_cast<int>(world.layer.num_experts), L = E / W;
      const plan_detail::HostStepCounts counts = plan_detail::routing_counts(routing, E);
      int max_rows = 0;
      for (int d = 0; d < W; ++d) max_rows = std::max(max_rows, counts.view().expert_rows(d));

      const plan_detail::SequentialShape shape = plan_detail::gpu_sequential_shape(world.layer, 0, world.tokens_per_rank[0], DispatchVolume::RowPerExpert);
      const plan_detail::PlanCapacity room = plan_detail::sequential_capacity(W, L, max_rows, shape.tokens, shape);
      cuda::DevicePlanTables tables(room, W, E);
      cuda::DeviceArray<int> device_counts(counts.counts().data(), counts.counts().size());
      cudaStream_t stream = nullptr;
      TILEMOE_CUDA_CHECK(cudaStreamCreate(&stream));
      cudaEvent_t start = nullptr, stop = nullptr;
      TILEMOE_CUDA_CHECK(cudaEventCreate(&start));
      TILEMOE_CUDA_CHECK(cudaEventCreate(&stop));
      // the tables the plan replaced: rank 0's local row offsets, GEMM0 and GEMM1 on 1x2 clusters
      std::vector<int> row_offset;
      for (int e = 0; e <= L; ++e) row_offset.push_back(counts.view().expert_row(0, e));
      cuda::DeviceArray<int> device_row_offset(row_offset.data(), row_offset.size());
      const int gemm0_n = static_cast<int>(world.layer.activation == Activation::SwiGLU ? 2 * shape.ffn_hidden : shape.ffn_hidden);
      const int cap0 = static_cast<int>(cuda::max_tile_entries(max_rows, L, gemm0_n, cuda::PlannedCluster::N2));
      const int cap1 = static_cast<int>(cuda::max_tile_entries(max_rows, L, static_cast<int>(shape.hidden), cuda::PlannedCluster::N2));
      cuda::DeviceArray<cuda::GemmTileEntry> table0(static_cast<std::size_t>(cap0)), table1(static_cast<std::size_t>(cap1));
      cuda::DeviceArray<int> table_count(2);
      const auto compile = [&] { cuda::launch_compile_sequential(stream, device_counts.data(), nullptr, nullptr, shape, tables); };
      const auto build_tables = [&] {
        cuda::launch_build_tile_table(stream, device_row_offset.data(), L, gemm0_n, cuda::PlannedCluster::N2, cuda::TileFlags::None,
                                      table0.data(), cap0, table_count.data(), shape.band_block[0]);
        cuda::launch_build_tile_table(stream, device_row_offset.data(), L, static_cast<int>(shape.hidden), cuda::PlannedCluster::N2,
                                      cuda::TileFlags::None, table1.data(), cap1, table_count.data() + 1);
      };
      const auto time_us = [&](const auto& launch) {
        launch();  // warm-up
        constexpr int kRuns = 50;
        TILEMOE_CUDA_CHECK(cudaEventRecord(start, stream));
        for (int i = 0; i < kRuns; ++i) launch();
        TILEMOE_CUDA_CHECK(cudaEventRecord(stop, stream));
        TILEMOE_CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        TILEMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        return 1000.0 * ms / kRuns;
      };
      const double table_us = time_us(build_tables), compile_us = time_us(compile);
      StepPlan device_plan;
      device_plan.rank = 0;
      tables.download(stream, [&](const char*) { TILEMOE_CUDA_CHECK(cudaStreamSynchronize(stream)); }, device_plan);
      const StepPlan host_plan = plan_detail::compile_sequential_at(world, routing, PlanOptions{}, shape)[0];
      const std::string difference = plan_detail::first_table_difference(device_plan, host_plan);
      if (!difference.empty()) ++failures;
      std::printf("%-22s %d ranks: sequential  %6zu tiles %5zu segments %4zu combines: %7.1f us per compile, %6.1f us for the two "
                  "tile tables it replaced; %s\n",
                  c.id().c_str(), W, device_plan.tiles.size(), device_plan.segments.size(), device_plan.combines.size(), compile_us,
                  table_us, difference.empty() ? "equal to the host compiler's" : ("DIFFERS: " + difference).c_str());
      if (W > 1) {  // tile_signal: GEMM1 in band blocks of the default for 8 consumer CTAs, a band per segment
        int sms = 0;
        TILEMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
        const int column_tiles = static_cast<int>((shape.hidden + cuda::kPlannedTileN - 1) / cuda::kPlannedTileN);
        const int band_block = default_band_block(std::max(2, sms / W - 8), column_tiles);
        const plan_detail::TileSignalShape ts_shape =
            plan_detail::gpu_tile_signal_shape(world.layer, 0, world.tokens_per_rank[0], band_block, 1, DispatchVolume::RowPerExpert);
        cuda::DevicePlanTables ts_tables(plan_detail::tile_signal_capacity(W, L, max_rows, shape.tokens, shape), W, E);
        std::vector<int> block_offset;
        for (int e = 0; e < L; ++e) {
          for (int q = 0; q < W; ++q) block_offset.push_back(counts.view().block_row(0, e, q));
        }
        block_offset.push_back(counts.view().expert_rows(0));
        cuda::DeviceArray<int> device_block_offset(block_offset.data(), block_offset.size());
        const int band_room = static_cast<int>(cuda::max_bands(max_rows, L));
        cuda::DeviceArray<cuda::TileBand> bands(static_cast<std::size_t>(band_room));
        cuda::DeviceArray<cuda::GemmTileEntry> scratch(static_cast<std::size_t>(cap1));
        cuda::DeviceArray<int> band_count(1);
        const auto ts_compile = [&] { cuda::launch_compile_tile_signal(stream, device_counts.data(), nullptr, ts_shape, ts_tables); };
        const auto ts_build = [&] {
          cuda::launch_build_tile_table(stream, device_row_offset.data(), L, gemm0_n, cuda::PlannedCluster::N2, cuda::TileFlags::None,
                                        table0.data(), cap0, table_count.data(), shape.band_block[0]);
          cuda::launch_build_tile_table(stream, device_row_offset.data(), L, static_cast<int>(shape.hidden), cuda::PlannedCluster::N2,
                                        cuda::TileFlags::PerBand, table1.data(), cap1, table_count.data() + 1, band_block);
          cuda::launch_order_remote_first(stream, table1.data(), table_count.data() + 1, 2, device_block_offset.data(), L, W, 0,
                                          scratch.data());
          cuda::launch_build_bands(stream, device_row_offset.data(), device_block_offset.data(), L, W, 0, bands.data(), band_room,
                                   band_count.data());
        };
        const double ts_table_us = time_us(ts_build), ts_compile_us = time_us(ts_compile);
        StepPlan ts_device;
        ts_device.rank = 0;
        ts_tables.download(stream, [&](const char*) { TILEMOE_CUDA_CHECK(cudaStreamSynchronize(stream)); }, ts_device);
        const StepPlan ts_host = plan_detail::compile_tile_signal_at(world, routing, PlanOptions{}, ts_shape)[0];
        const std::string ts_difference = plan_detail::first_table_difference(ts_device, ts_host);
        if (!ts_difference.empty()) ++failures;
        std::printf("%-22s %d ranks: tile_signal %6zu tiles %5zu segments %4zu combines: %7.1f us per compile, %6.1f us for the "
                    "four tables of its GPU schedule; %s\n",
                    c.id().c_str(), W, ts_device.tiles.size(), ts_device.segments.size(), ts_device.combines.size(), ts_compile_us,
                    ts_table_us, ts_difference.empty() ? "equal to the host compiler's" : ("DIFFERS: " + ts_difference).c_str());
      }
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
