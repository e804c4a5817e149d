// The CPU executor: every strategy gives bitwise the dense reference's output for any world
// size, routing skew and worker timing; stalls become errors naming the peer.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "step_fixture.hpp"
#include "tilemoe/cpu_executor.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;
using namespace tilemoe::testing;
using ::testing::HasSubstr;

namespace {

constexpr Strategy kStrategies[] = {Strategy::Sequential, Strategy::TileSignal, Strategy::Comet};

void expect_bitwise(const std::vector<Matrix>& a, const std::vector<Matrix>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t r = 0; r < a.size(); ++r) EXPECT_TRUE(a[r].bitwise_equal(b[r])) << what << ", rank " << r;
}

}  // namespace

TEST(CpuExecutor, AllStrategiesEqualTheDenseReferenceBitwiseOverARandomSweep) {
  std::mt19937_64 rng(2026);
  for (int trial = 0; trial < 48; ++trial) {
    const int world_size = 1 + static_cast<int>(rng() % 8);
    const std::int64_t experts = world_size * (1 + static_cast<std::int64_t>(rng() % (64 / world_size < 4 ? 64 / world_size : 4)));
    const std::int64_t k = 1 + static_cast<std::int64_t>(rng() % std::min<std::int64_t>(experts, 8));
    std::vector<std::int64_t> tokens;
    for (int r = 0; r < world_size; ++r) {
      const auto draw = rng() % 10;
      tokens.push_back(draw == 0 ? 0 : draw == 1 ? static_cast<std::int64_t>(rng() % 512) : static_cast<std::int64_t>(rng() % 48));
    }
    EpWorld world = make_world(tokens, 8 * (1 + static_cast<std::int64_t>(rng() % 3)), 8 * (1 + static_cast<std::int64_t>(rng() % 3)),
                               experts, k, trial % 4 == 3 ? DType::F32 : DType::BF16);
    if (trial % 3 == 1) world.layer.capacity_factor = 0.5 + static_cast<double>(rng() % 4) * 0.25;
    if (trial % 5 == 2) world.layer.renormalize = true;
    if (trial % 7 == 4) world.layer.activation = Activation::GELU;
    const auto pattern = static_cast<RoutingPattern>(trial % 3);
    const StepCase c = make_case(world, pattern, static_cast<std::uint64_t>(trial) + 100);
    const auto dense = dense_reference(world, c.inputs, c.routing, c.weights);
    PlanOptions o;
    o.tile_m = 1 + static_cast<std::int64_t>(rng() % 8);
    o.tile_n = 8 * (1 + static_cast<std::int64_t>(rng() % 2));
    o.compute_workers = 1 + static_cast<int>(rng() % 2);
    o.comm_workers = 1 + static_cast<int>(rng() % 2);
    o.tile_signal.bands_per_segment = 1 + static_cast<int>(rng() % 2);
    o.combine_tokens = 1 + static_cast<std::int64_t>(rng() % 16);
    o.dispatch = (trial / 2) % 2 == 0 ? DispatchVolume::OncePerRank : DispatchVolume::RowPerExpert;
    CpuRunOptions run;
    run.max_delay_us = trial % 2 == 0 ? 200 : 0;  // shake the timing in half of the trials
    run.delay_seed = static_cast<std::uint64_t>(trial);
    for (Strategy s : kStrategies) {
      const std::string what = "trial " + std::to_string(trial) + " " + std::string(strategy_name(s)) + " W=" +
                               std::to_string(world_size) + " E=" + std::to_string(experts) + " k=" + std::to_string(k) +
                               " " + std::string(routing_pattern_name(pattern)) + " " + std::string(dispatch_volume_name(o.dispatch));
      const auto plans = compile_plan(s, world, c.routing, o);
      validate_plan(plans);
      const StepRun result = run_step(plans, c.weights, c.inputs, run);
      expect_bitwise(result.outputs, dense, what);
    }
  }
}

TEST(CpuExecutor, AccurateAgainstFp64) {
  const EpWorld world = make_world({40, 17, 33, 0}, 64, 96, 8, 2);
  const StepCase c = make_case(world, RoutingPattern::Balanced, 5);
  const auto fp64 = fp64_reference(world, c.inputs, c.routing, c.weights);
  const auto result = run_step(compile_plan(Strategy::TileSignal, world, c.routing, {}), c.weights, c.inputs);
  const ErrorStats e = compare(result.outputs, fp64);
  EXPECT_TRUE(e.finite);
  EXPECT_LT(e.relative_frobenius, 1e-2);
  EXPECT_GT(e.relative_frobenius, 1e-4) << "bf16 rounding should be visible: is the reference really fp64?";
  // fp32 storage is far closer
  EpWorld fp32 = world;
  fp32.layer.dtype = DType::F32;
  const StepCase c32 = make_case(fp32, RoutingPattern::Balanced, 5);
  const auto r32 = run_step(compile_plan(Strategy::Comet, fp32, c32.routing, {}), c32.weights, c32.inputs);
  EXPECT_LT(compare(r32.outputs, fp64_reference(fp32, c32.inputs, c32.routing, c32.weights)).relative_frobenius, 1e-5);
}

TEST(CpuExecutor, TheRoutersWeightScalingTheExpertsInputIsRunByEveryStrategy) {
  // Llama-4's rule (top-1 here, and top-2: the rule is defined for any k): expert(x * w), summed unweighted
  for (const std::int64_t k : {1, 2}) {
    EpWorld world = make_world({37, 0, 21}, 32, 48, 6, k);
    world.layer.router.score = ScoreFunction::Sigmoid;
    world.layer.router.scales_input = true;
    const StepCase c = make_case(world, RoutingPattern::Skewed, 17);
    const auto dense = dense_reference(world, c.inputs, c.routing, c.weights);
    for (DispatchVolume v : {DispatchVolume::OncePerRank, DispatchVolume::RowPerExpert}) {
      PlanOptions o;
      o.dispatch = v;
      for (Strategy s : kStrategies) {
        const auto plans = compile_plan(s, world, c.routing, o);
        validate_plan(plans);
        expect_bitwise(run_step(plans, c.weights, c.inputs).outputs, dense,
                       "top-" + std::to_string(k) + " " + std::string(strategy_name(s)) + " " + std::string(dispatch_volume_name(v)));
      }
    }
    const ErrorStats e = compare(dense, fp64_reference(world, c.inputs, c.routing, c.weights));
    EXPECT_TRUE(e.finite);
    EXPECT_LT(e.relative_frobenius, 1e-2);
    // the rule changes the output: the same routing with the weight on the output is another layer
    EpWorld on_output = world;
    on_output.layer.router.scales_input = false;
    const auto other = dense_reference(on_output, c.inputs, c.routing, c.weights);
    EXPECT_GT(compare(other, fp64_reference(world, c.inputs, c.routing, c.weights)).relative_frobenius, 0.05);
  }
}

TEST(CpuExecutor, EdgeCases) {
  struct Edge {
    const char* name;
    EpWorld world;
    RoutingPattern pattern;
  };
  const std::vector<Edge> edges = {
      {"no tokens anywhere", make_world({0, 0, 0}, 8, 8, 3, 1), RoutingPattern::Balanced},
      {"all to one expert", make_world({30, 30}, 16, 16, 4, 1), RoutingPattern::OneExpert},
      {"top_k = E", make_world({9, 5}, 16, 8, 4, 4), RoutingPattern::Balanced},
      {"hidden 8, odd tokens", make_world({7, 1, 13, 3}, 8, 8, 4, 2), RoutingPattern::Skewed},
      {"one rank", make_world({21}, 16, 16, 4, 2), RoutingPattern::Balanced},
      {"8 ranks, 64 experts, top-8", make_world({5, 9, 0, 17, 3, 8, 1, 12}, 8, 8, 64, 8), RoutingPattern::Skewed},
  };
  for (const Edge& edge : edges) {
    const StepCase c = make_case(edge.world, edge.pattern, 11);
    const auto dense = dense_reference(edge.world, c.inputs, c.routing, c.weights);
    for (Strategy s : kStrategies) {
      const auto plans = compile_plan(s, edge.world, c.routing, {});
      validate_plan(plans);
      expect_bitwise(run_step(plans, c.weights, c.inputs).outputs, dense, std::string(edge.name) + " " + std::string(strategy_name(s)));
    }
  }
}

TEST(CpuExecutor, OutputsAreNotZeroAndPoisonWouldShow) {
  const EpWorld world = make_world({16, 16}, 16, 16, 4, 2);
  const StepCase c = make_case(world, RoutingPattern::Balanced, 3);
  const auto out = run_step(compile_plan(Strategy::Comet, world, c.routing, {}), c.weights, c.inputs).outputs;
  int nonzero = 0;
  for (const Matrix& m : out) {
    for (float v : m.to_floats()) {
      ASSERT_TRUE(std::isfinite(v));
      nonzero += v != 0.0f;
    }
  }
  EXPECT_GT(nonzero, 400);
  // a plan that forgets a combine task leaves poisoned (NaN) rows behind
  auto plans = compile_plan(Strategy::Sequential, world, c.routing, {});
  plans[1].combines[0].token_end = plans[1].combines[0].token_begin + 1;
  const auto broken = run_step(plans, c.weights, c.inputs).outputs;
  EXPECT_TRUE(std::isnan(broken[1].at(1, 0)));
}

TEST(CpuExecutor, ASilentRankFailsTheStepWithAMessageNamingIt) {
  const EpWorld world = make_world({8, 8, 8, 8}, 16, 16, 4, 2);
  const StepCase c = make_case(world, RoutingPattern::Balanced, 1);
  for (Strategy s : kStrategies) {
    CpuRunOptions run;
    run.timeout = std::chrono::milliseconds(200);
    run.silent_rank = 2;
    const auto start = std::chrono::steady_clock::now();
    try {
      run_step(compile_plan(s, world, c.routing, {}), c.weights, c.inputs, run);
      FAIL() << "the step finished without rank 2's communication";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Timeout);
      EXPECT_THAT(e.what(), HasSubstr("timed out after 200 ms"));
      EXPECT_THAT(e.what(), ::testing::ContainsRegex("^step timed out after 200 ms: rank [013] waits for rank 2 "));
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "the other workers must stop fast";
  }
}

TEST(CpuExecutor, RejectsInputsThatDoNotMatchThePlans) {
  const EpWorld world = make_world({4, 4}, 16, 16, 4, 2);
  const StepCase c = make_case(world, RoutingPattern::Balanced, 1);
  const auto plans = compile_plan(Strategy::Sequential, world, c.routing, {});
  auto inputs = c.inputs;
  inputs[1] = Matrix(DType::BF16, 5, 16);
  EXPECT_THROW(run_step(plans, c.weights, inputs), Error);
  inputs.pop_back();
  EXPECT_THROW(run_step(plans, c.weights, inputs), Error);
}

TEST(CpuExecutor, RecordsEveryTaskOnceForTraces) {
  const EpWorld world = make_world({12, 12}, 16, 16, 4, 2);
  const StepCase c = make_case(world, RoutingPattern::Balanced, 1);
  const auto plans = compile_plan(Strategy::TileSignal, world, c.routing, {});
  const StepRun run = run_step(plans, c.weights, c.inputs);
  std::size_t tasks = 0;
  for (const StepPlan& p : plans) tasks += p.task_count();
  EXPECT_EQ(run.records.size(), tasks);
  for (const TaskRecord& r : run.records) EXPECT_LE(r.start_ns, r.end_ns);
  const StepStats stats = summarize(plans, run.records, run.wall_ns);
  EXPECT_GT(stats.compute_busy, 0.0);
  EXPECT_LE(stats.compute_busy, 1.0);
}
