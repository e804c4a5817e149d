// The memory estimate that lets a step too large for the machine be refused before it allocates.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

#include "step_fixture.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/memory_estimate.hpp"

using namespace tilemoe;
using ::testing::HasSubstr;

TEST(MemoryEstimate, CountsWeightsDataAndTheExecutorsBuffers) {
  const EpWorld world = tilemoe::testing::make_world({100, 100}, 64, 128, 4, 2);
  StepMemoryInputs in;
  in.world = &world;
  const StepMemory before = estimate_step_memory(in);
  EXPECT_EQ(before.weights, 4u * 64 * 128 * 4 * 3);  // SwiGLU: w1, w3, w2 as fp32
  EXPECT_EQ(before.executor, 0u) << "no routing yet";
  EXPECT_GE(before.data, 200u * 64 * (2 + 4));  // inputs in bf16 and as read
  const auto step = tilemoe::testing::make_case(world, RoutingPattern::OneExpert, 3);
  in.routing = &step.routing;
  const StepMemory after = estimate_step_memory(in);
  // one-expert routing sends all 200 tokens' first slots to rank 0: its buffers set the size
  EXPECT_GE(after.executor, 2u * 200 * 128 * 2);  // Activation rows x ffn x bf16, on both ranks
  EXPECT_GT(after.total(), before.total());
  in.strategies = 3;
  EXPECT_GT(estimate_step_memory(in).results, after.results);
}

TEST(MemoryEstimate, CountsASharedExpertAndExpertBiases) {
  const EpWorld world = tilemoe::testing::make_world({100, 100}, 64, 128, 4, 2);
  StepMemoryInputs in;
  in.world = &world;
  const std::uint64_t routed = estimate_step_memory(in).weights;
  in.shared_ffn_hidden = 256;
  EXPECT_EQ(estimate_step_memory(in).weights, routed + 64u * 256 * 4 * 3 + 64u * 256 * 4);  // its three matrices, its gate bound
  in.shared_ffn_hidden = 0;
  in.expert_biases = true;
  EXPECT_EQ(estimate_step_memory(in).weights, routed + 4u * (2 * 128 + 64) * 4);  // gate, up and down biases per expert
}

TEST(MemoryEstimate, AbsurdSizesSaturateInsteadOfWrapping) {
  EpWorld world = tilemoe::testing::make_world({std::numeric_limits<std::int64_t>::max() / 2}, 1 << 20, 1 << 20, 1 << 20, 8);
  StepMemoryInputs in;
  in.world = &world;
  const StepMemory m = estimate_step_memory(in);
  EXPECT_EQ(m.total(), std::numeric_limits<std::uint64_t>::max());
  EXPECT_THAT(memory_text(m.total()), HasSubstr("more than 16 EiB"));
  EXPECT_THROW(check_step_memory(m, std::uint64_t{1} << 40, "--max-memory"), Error);
}

TEST(MemoryEstimate, SizesParseWithBinarySuffixes) {
  EXPECT_EQ(parse_memory_size("1000", "--max-memory"), 1000u);
  EXPECT_EQ(parse_memory_size("64k", "--max-memory"), 64u << 10);
  EXPECT_EQ(parse_memory_size("1.5G", "--max-memory"), 3u << 29);
  EXPECT_EQ(parse_memory_size("2TB", "--max-memory"), std::uint64_t{2} << 40);
  for (const char* bad : {"", "G", "-5", "0", "1.5X", "inf", "0x10", "1e300"}) {
    EXPECT_THROW(parse_memory_size(bad, "--max-memory"), Error) << bad;
  }
  EXPECT_GT(available_memory_bytes(), 0u) << "Linux has /proc/meminfo";
}

TEST(MemoryEstimate, RanksWithoutTokensNeedNoExpertRows) {
  // 64 ranks without tokens: no rows anywhere (counting a tile's padding for every (expert,
  // source) pair once made such a world look like gigabytes)
  const EpWorld world = tilemoe::testing::make_world(std::vector<std::int64_t>(64, 0), 4096, 14336, 64, 1);
  const std::vector<Routing> routing(64, Routing{});
  StepMemoryInputs in;
  in.world = &world;
  in.routing = &routing;
  EXPECT_LT(estimate_step_memory(in).executor, 1u << 20);
}

TEST(MemoryEstimate, TheCudaBackendsHostOracleCountsNoWholeStepOnTheCpu) {
  // the CUDA backend checks its output on a bounded token sample: the CPU engine's buffers and
  // the dense reference of every token are never allocated, and must not refuse such a step
  const EpWorld world = tilemoe::testing::make_world({100, 100}, 64, 128, 4, 2);
  const auto step = tilemoe::testing::make_case(world, RoutingPattern::Balanced, 3);
  StepMemoryInputs in;
  in.world = &world;
  in.routing = &step.routing;
  const StepMemory cpu = estimate_step_memory(in);
  in.cpu_engine = false;
  const StepMemory cuda = estimate_step_memory(in);
  EXPECT_GT(cpu.executor, 0u);
  EXPECT_EQ(cuda.executor, 0u);
  EXPECT_LT(cuda.references, cpu.references);
  EXPECT_EQ(cuda.weights, cpu.weights) << "the host still holds every expert's weights (to upload them and for the oracle)";
}
