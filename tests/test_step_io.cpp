// Reading a step's tensors: expert names, shapes and values that the files may get wrong.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "core/expert_tensor_name.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/safetensors.hpp"

using namespace tilemoe;
using ::testing::HasSubstr;

namespace {

std::string bad_input_message(const std::string& name) {
  try {
    parse_expert_tensor_name(name);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput);
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST(ExpertTensorName, TakesTheHuggingFaceNameApart) {
  const auto name = parse_expert_tensor_name("model.layers.0.block_sparse_moe.experts.17.w3.weight");
  ASSERT_TRUE(name);
  EXPECT_EQ(name->prefix, "model.layers.0.block_sparse_moe.");
  EXPECT_EQ(name->expert, 17);
  EXPECT_EQ(name->part, "w3");
  // the last "experts." counts, as with the greedy regex it replaces
  const auto nested = parse_expert_tensor_name("a.experts.1.experts.0.w1.weight");
  ASSERT_TRUE(nested);
  EXPECT_EQ(nested->prefix, "a.experts.1.");
  EXPECT_EQ(nested->expert, 0);
  EXPECT_TRUE(parse_expert_tensor_name("experts.0.w2.weight"));
}

TEST(ExpertTensorName, QwenAndDeepSeekNamesAreTheSameMatrices) {
  const char* spellings[][2] = {{"gate_proj", "w1"}, {"up_proj", "w3"}, {"down_proj", "w2"}};
  for (const auto& [spelling, part] : spellings) {
    const auto name = parse_expert_tensor_name(std::string("model.layers.3.mlp.experts.5.") + spelling + ".weight");
    ASSERT_TRUE(name) << spelling;
    EXPECT_EQ(name->prefix, "model.layers.3.mlp.");
    EXPECT_EQ(name->expert, 5);
    EXPECT_EQ(name->part, part);
    EXPECT_EQ(name->spelling, spelling);
  }
  for (const char* name : {"experts.0.xgate_proj.weight", "experts.0.gate_proj.bias", "experts.0.proj.weight", "experts.0.gate.weight"}) {
    EXPECT_FALSE(parse_expert_tensor_name(name)) << name;
  }
}

TEST(ExpertTensorName, OtherTensorsAreNotExperts) {
  for (const char* name : {"input", "experts.0.w4.weight", "experts.0.w1.bias", "experts.x.w1.weight", "experts..w1.weight",
                           "xperts.0.w1.weight", "experts.0w1.weight", "experts.0.xw1.weight", "w1.weight", ""}) {
    EXPECT_FALSE(parse_expert_tensor_name(name)) << name;
  }
}

TEST(ExpertTensorName, ALongNameIsOnePass) {
  const std::string prefix(1 << 22, 'x');  // 4 MiB: a recursive matcher overflows its stack
  const auto name = parse_expert_tensor_name(prefix + "experts.3.w1.weight");
  ASSERT_TRUE(name);
  EXPECT_EQ(name->prefix.size(), prefix.size());
  EXPECT_FALSE(parse_expert_tensor_name(prefix));
}

TEST(ExpertTensorName, NonCanonicalIndicesAreRefusedNotAliased) {
  EXPECT_THAT(bad_input_message("experts.01.w1.weight"), HasSubstr("has a leading zero; write it as 1"));
  EXPECT_THAT(bad_input_message("experts.00.w1.weight"), HasSubstr("write it as 0"));
  EXPECT_THAT(bad_input_message("experts.1048576.w1.weight"), HasSubstr("not below 1048576"));
  EXPECT_THAT(bad_input_message("experts.123456789012.w1.weight"), HasSubstr("not below"));
  EXPECT_EQ(parse_expert_tensor_name("experts.1048575.w1.weight")->expert, 1048575);
  EXPECT_EQ(parse_expert_tensor_name("experts.0.w1.weight")->expert, 0);
}

TEST(PrintableName, EscapesControlCharactersAndCutsLongNames) {
  const std::string shown = safetensors::printable_name("evil\x1b[2J\x07name");
  EXPECT_EQ(shown.find('\x1b'), std::string::npos);
  EXPECT_EQ(shown.find('\x07'), std::string::npos);
  EXPECT_THAT(shown, HasSubstr("\\u001b[2J"));
  const std::string cut = safetensors::printable_name(std::string(100000, 'n'));
  EXPECT_LT(cut.size(), 300u);
  EXPECT_THAT(cut, HasSubstr("(100000 bytes)"));
}
