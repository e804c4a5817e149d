#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "refusal.hpp"
#include "tilemoe/config.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/weights.hpp"

using namespace tilemoe;
using ::testing::HasSubstr;

namespace {

MoeConfig good() {
  MoeConfig c;
  c.tokens = 16;
  c.hidden = 64;
  c.ffn_hidden = 128;
  c.num_experts = 8;
  c.top_k = 2;
  return c;
}

std::string bad_input_message(const MoeConfig& c, ParallelConfig p = {}) {
  return tilemoe::testing::refusal([&] { validate(c, p); });
}

}  // namespace

TEST(Config, AcceptsAGoodConfigAndZeroTokens) {
  EXPECT_NO_THROW(validate(good(), {4, 3}));
  MoeConfig c = good();
  c.tokens = 0;
  EXPECT_NO_THROW(validate(c, {2, 0}));
}

TEST(Config, RejectsWithMessagesThatSayWhatToChange) {
  MoeConfig c = good();
  EXPECT_THAT(bad_input_message(c, {3, 0}), HasSubstr("not divisible by the world size 3"));
  c = good();
  c.top_k = 0;
  EXPECT_THAT(bad_input_message(c), HasSubstr("top_k = 0 is outside [1, num_experts = 8]"));
  c.top_k = 9;
  EXPECT_THAT(bad_input_message(c), HasSubstr("top_k = 9"));
  c = good();
  c.hidden = 60;
  EXPECT_THAT(bad_input_message(c), HasSubstr("hidden = 60 is not a multiple of 8"));
  EXPECT_THAT(bad_input_message(c), HasSubstr("use 56 or 64"));
  c = good();
  c.ffn_hidden = 12;
  EXPECT_THAT(bad_input_message(c), HasSubstr("ffn_hidden = 12"));
  c = good();
  c.tokens = -1;
  EXPECT_THAT(bad_input_message(c), HasSubstr("negative"));
  c = good();
  c.hidden = -8;
  EXPECT_THAT(bad_input_message(c), HasSubstr("must be positive"));
  c = good();
  c.capacity_factor = -0.5;
  EXPECT_THAT(bad_input_message(c), HasSubstr("capacity_factor"));
  c = good();
  EXPECT_THAT(bad_input_message(c, {0, 0}), HasSubstr("world size = 0"));
  EXPECT_THAT(bad_input_message(c, {2, 2}), HasSubstr("rank = 2 is outside [0, 2)"));
}

TEST(Config, ExpertOwnership) {
  MoeConfig c = good();
  EXPECT_EQ(local_expert_count(c, {4, 1}), 2);
  EXPECT_EQ(first_local_expert(c, {4, 1}), 2);
  EXPECT_EQ(owner_of_expert(c, 4, 7), 3);
  EXPECT_EQ(owner_of_expert(c, 4, 0), 0);
}

TEST(Config, WorldNamesTheRankWithNegativeTokens) {
  EpWorld world{good(), {4, -2, 0}};
  world.layer.num_experts = 6;
  try {
    validate(world);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 1 has -2 tokens"));
  }
  world.tokens_per_rank = {4, 0, 3};
  EXPECT_NO_THROW(validate(world));
  EXPECT_EQ(world.total_tokens(), 7);
  EXPECT_EQ(split_tokens_evenly(10, 4), (std::vector<std::int64_t>{3, 3, 2, 2}));
}

TEST(Config, ParsesNames) {
  EXPECT_EQ(parse_activation("gelu"), Activation::GELU);
  EXPECT_EQ(parse_dtype("bf16"), DType::BF16);
  EXPECT_EQ(parse_dtype("fp32"), DType::F32);
  EXPECT_THROW(parse_dtype("fp8"), Error);
  EXPECT_THROW(parse_activation("relu"), Error);
}

TEST(DTypeRounding, RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties go to even (1.0)
  EXPECT_EQ(float_to_bf16_bits(1.00390625f), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(1.01171875f), 0x3f82);  // halfway, rounds up to even
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::nanf("")))));
  EXPECT_EQ(round_to(DType::F32, 1.00390625f), 1.00390625f);
}

TEST(Weights, AMismatchedShapeIsRefusedNamingBoth) {
  MoeConfig layer;
  layer.hidden = 16;
  layer.ffn_hidden = 24;
  layer.num_experts = 4;
  layer.top_k = 2;
  const ExpertWeights weights = random_weights(layer, 1);
  EXPECT_NO_THROW(check_weights_match(weights, layer));
  MoeConfig wider = layer;
  wider.ffn_hidden = 32;
  try {
    check_weights_match(weights, wider);
    FAIL() << "weights of ffn 24 passed for a layer of ffn 32";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput);
    EXPECT_NE(std::string(e.what()).find("4 experts of hidden 16, ffn 24, swiglu, the layer has 4 experts of hidden 16, ffn 32"),
              std::string::npos)
        << e.what();
  }
  MoeConfig clamped = layer;
  clamped.swiglu.limit = 7.0f;
  EXPECT_THROW(check_weights_match(weights, clamped), Error);
}
