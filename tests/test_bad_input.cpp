// The CLI driven with bad values, bad files and bad paths: each must end in exit 2 with a
// message that says what to change (never a crash, a hang, a silent wrong answer or a file
// left behind). Issue 25's classes, one test (or a few) per class.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cli_fixture.hpp"
#include "tilemoe/safetensors.hpp"

using tilemoe::testing::Result;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;
namespace st = tilemoe::safetensors;

namespace {

class BadInput : public tilemoe::testing::Cli {
 protected:
  static constexpr std::int64_t kTokens = 12, kExperts = 4;

  static std::span<const std::byte> bytes(const std::vector<float>& v) {
    return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(float)};
  }

  // "input" [kTokens, hidden] and "router_logits" [kTokens, kExperts], random; `edit` may
  // change the input's values before they are written.
  std::string write_inputs(const std::string& name, std::int64_t hidden,
                           const std::function<void(std::vector<float>&)>& edit = {}) {
    std::mt19937_64 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<std::size_t>(kTokens * hidden)), logits(kTokens * kExperts);
    for (float& v : x) v = normal(rng);
    for (float& v : logits) v = normal(rng);
    if (edit) edit(x);
    st::write(path(name), {{"input", st::ElementType::F32, {kTokens, hidden}, bytes(x)},
                           {"router_logits", st::ElementType::F32, {kTokens, kExperts}, bytes(logits)}});
    return path(name);
  }

  // SwiGLU experts named "<prefix>experts.<index(e)>.<w>.weight"; `edit` may change the
  // values of one matrix, given its name.
  std::string write_weights(const std::string& name, std::int64_t hidden, std::int64_t ffn, const std::string& prefix = "m.",
                            const std::function<std::string(std::int64_t)>& index = {},
                            const std::function<void(const std::string&, std::vector<float>&)>& edit = {}) {
    std::mt19937_64 rng(5);
    std::normal_distribution<float> normal(0.0f, 0.2f);
    std::vector<std::vector<float>> values(kExperts * 3);
    std::vector<st::TensorToWrite> tensors;
    for (std::int64_t e = 0; e < kExperts; ++e) {
      const char* parts[] = {"w1", "w3", "w2"};
      for (int m = 0; m < 3; ++m) {
        auto& v = values[static_cast<std::size_t>(e * 3 + m)];
        v.resize(static_cast<std::size_t>(hidden * ffn));
        for (float& x : v) x = normal(rng);
        const std::string tensor = prefix + "experts." + (index ? index(e) : std::to_string(e)) + "." + parts[m] + ".weight";
        if (edit) edit(tensor, v);
        tensors.push_back({tensor, st::ElementType::F32,
                           m == 2 ? std::vector<std::int64_t>{hidden, ffn} : std::vector<std::int64_t>{ffn, hidden}, bytes(v)});
      }
    }
    st::write(path(name), tensors);
    return path(name);
  }

  const std::string kLayer = " --ranks 2 --top-k 2 ";
};

}  // namespace

// Class 1: the expert-name matching recursed on the name's length (SIGSEGV for long names).
TEST_F(BadInput, LongTensorNamesAreMatchedWithoutRecursion) {
  const std::string prefix(200000, 'a');
  const std::string weights = write_weights("weights.safetensors", 16, 16, prefix + ".");
  const Result r = tilemoe("run" + kLayer + "--inputs " + write_inputs("inputs.safetensors", 16) + " --weights " + weights);
  EXPECT_EQ(r.code, 0) << r.err.substr(0, 2000);
  EXPECT_THAT(r.out, Not(HasSubstr(" NO")));
}

// Class 1: the weights' hidden size silently won over the inputs', and the references read the
// inputs past their end.
TEST_F(BadInput, InputsAndWeightsThatDisagreeOnTheHiddenSizeAreRefused) {
  for (const std::int64_t weights_hidden : {8, 32, 4096}) {
    const Result r = tilemoe("run" + kLayer + "--inputs " + write_inputs("inputs.safetensors", 16) + " --weights " +
                             write_weights("weights.safetensors", weights_hidden, 8));
    EXPECT_EQ(r.code, 2) << weights_hidden << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("inputs.safetensors has hidden 16 but"));
    EXPECT_THAT(r.err, HasSubstr("weights.safetensors has " + std::to_string(weights_hidden) + ":"));
    EXPECT_THAT(r.err, HasSubstr("must describe the same layer"));
  }
}

// Class 2: 1e308 overflowed the capacity to a negative number: every slot dropped, exit 0.
TEST_F(BadInput, CapacityFactorsPastTheRangeAreRefused) {
  for (const std::string factor : {"1e308", "1e7", "inf", "nan"}) {
    const Result r = tilemoe("run --tokens 16 --hidden 16 --ffn-hidden 16 --capacity-factor " + factor);
    EXPECT_EQ(r.code, 2) << factor << "\n" << r.out;
    EXPECT_THAT(r.err, HasSubstr("capacity_factor")) << factor;
  }
  // the largest accepted factor drops nothing: the same output as dropless
  const Result dropless = tilemoe("run --json --tokens 16 --hidden 16 --ffn-hidden 16 --strategy sequential");
  const Result large = tilemoe("run --json --tokens 16 --hidden 16 --ffn-hidden 16 --strategy sequential --capacity-factor 1e6");
  ASSERT_EQ(large.code, 0) << large.err;
  ASSERT_EQ(dropless.code, 0) << dropless.err;
  EXPECT_THAT(large.out, HasSubstr("\"routed_rows\": 128"));
  EXPECT_THAT(dropless.out, HasSubstr("\"routed_rows\": 128"));
}

// Class 2: "experts.01" aliased expert 1 and replaced its weight without a word; long indices
// were cut to 9 digits.
TEST_F(BadInput, NonCanonicalExpertIndicesAreRefused) {
  const std::string inputs = write_inputs("inputs.safetensors", 16);
  struct Case {
    std::function<std::string(std::int64_t)> index;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](std::int64_t e) { return "0" + std::to_string(e); }, "has a leading zero; write it as 0"},
      {[](std::int64_t e) { return e == 3 ? std::string("0003") : std::to_string(e); }, "write it as 3"},
      {[](std::int64_t e) { return e == 2 ? std::string("1000000002") : std::to_string(e); }, "is not below 1048576"},
      {[](std::int64_t e) { return e == 1 ? std::string(5000, '9') : std::to_string(e); }, "(5000 digits)"},
  };
  for (const Case& c : cases) {
    const Result r = tilemoe("run" + kLayer + "--inputs " + inputs + " --weights " + write_weights("w.safetensors", 16, 16, "m.", c.index));
    EXPECT_EQ(r.code, 2) << c.message << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message));
    EXPECT_LT(r.err.size(), 2000u) << "the message quotes a long index whole";
  }
}

// Class 7: NaN or Inf in the input or a weight ended as exit 1 "differs from the dense
// reference" with every strategy bitwise equal.
TEST_F(BadInput, NonFiniteInputsAndWeightsNameTheTensorAndElement) {
  const std::string inputs = write_inputs("inputs.safetensors", 16);
  const std::string weights = write_weights("weights.safetensors", 16, 16);
  Result r = tilemoe("run" + kLayer + "--weights " + weights + " --inputs " +
                     write_inputs("nan.safetensors", 16, [](std::vector<float>& x) { x[2 * 16 + 3] = NAN; }));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("tensor \"input\" element [2, 3] is NaN"));

  r = tilemoe("run" + kLayer + "--inputs " + inputs + " --weights " +
              write_weights("inf.safetensors", 16, 16, "m.", {}, [](const std::string& name, std::vector<float>& v) {
                if (name == "m.experts.2.w2.weight") v[5 * 16 + 7] = -INFINITY;
              }));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("tensor \"m.experts.2.w2.weight\" element [5, 7] is infinite"));

  // finite in fp32 but not in bf16 storage
  r = tilemoe("run" + kLayer + "--weights " + weights + " --inputs " +
              write_inputs("big.safetensors", 16, [](std::vector<float>& x) { x[0] = 3.4e38f; }));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("element [0, 0] is"));
  EXPECT_THAT(r.err, HasSubstr("beyond the largest bf16"));
  r = tilemoe("run --dtype fp32" + kLayer + "--weights " + weights + " --inputs " + path("big.safetensors"));
  EXPECT_THAT(r.err, Not(HasSubstr("beyond the largest"))) << "fp32 storage holds 3.4e38";
}
