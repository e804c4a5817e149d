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

#include <sys/stat.h>
#include <sys/sysmacros.h>

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

// Class 8: values CLI11 accepts on its own.
TEST_F(BadInput, OptionValuesThatCannotMeanAnythingAreRefused) {
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"run --link-mbps nan", "--link-mbps nan is not a rate"},
      {"run --link-mbps inf", "--link-mbps inf is not a rate"},
      {"run --link-mbps -5", "is not a rate"},
      {"run --seed -1", "'-1' is negative: use 0 or more"},
      {"run --seed ' -7'", "is negative"},
      {"validate-plan --seed -1", "is negative"},
      {"run --tokens-per-rank ''", "has an empty entry"},
      {"run --tokens-per-rank 8,,8", "has an empty entry"},
      {"run --tokens-per-rank 8,8,", "has an empty entry"},
      {"run --tokens-per-rank 8,-1", "-1 tokens is negative"},
      {"run --tokens-per-rank 8,x", "'x' is not a token count"},
      {"run --tokens-per-rank 8,99999999999999999999", "is not a token count"},
  };
  for (const Case& c : cases) {
    const Result r = tilemoe(c.args + " --tokens 8 --hidden 16 --ffn-hidden 16", 60);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.args;
  }
  // a seed of 2^64 - 1 written out is still a seed
  EXPECT_EQ(tilemoe("run --seed 18446744073709551615 --tokens 8 --hidden 16 --ffn-hidden 16").code, 0);
}

// Class 8: a tensor name from a file reaches the terminal escaped (an escape sequence in a name
// cleared the screen).
TEST_F(BadInput, TensorNamesFromFilesAreEscapedInMessages) {
  const std::vector<float> values(16 * 16, 0.5f);
  // two layers' experts in one file: the message quotes both prefixes
  st::write(path("two.safetensors"), {{"\x1b[2J\x1b]0;pwned\x07.experts.0.w1.weight", st::ElementType::F32, {16, 16}, bytes(values)},
                                      {"m.experts.0.w1.weight", st::ElementType::F32, {16, 16}, bytes(values)}});
  Result r = tilemoe("run --weights " + path("two.safetensors"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("expert weights of 2 layers"));
  EXPECT_THAT(r.err, HasSubstr("\\u001b[2J"));
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\x07'), std::string::npos) << r.err;
  // a matrix of the wrong shape: the message quotes its name
  st::write(path("shape.safetensors"), {{"\x1b[31m.experts.0.w1.weight", st::ElementType::F32, {16, 16}, bytes(values)},
                                        {"\x1b[31m.experts.0.w2.weight", st::ElementType::F32, {8, 32}, bytes(values)},
                                        {"\x1b[31m.experts.0.w3.weight", st::ElementType::F32, {16, 16}, bytes(values)}});
  r = tilemoe("run --ranks 1 --top-k 1 --weights " + path("shape.safetensors"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("has shape [8, 32]"));
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
}

// Class 3: waits that ignored --timeout-ms.
TEST_F(BadInput, EveryWaitEndsWithinTheTimeout) {
  // the link emulation slept without a deadline: 1e-9 hung, 0.001 returned after ~19 s
  for (const std::string rate : {"1e-9", "0.001"}) {
    const Result r = tilemoe("run --tokens 24 --hidden 32 --ffn-hidden 48 --timeout-ms 2000 --link-mbps " + rate, 60);
    EXPECT_TRUE(r.code == 1 || r.code == 2) << rate << ": " << r.code << "\n" << r.err;
    EXPECT_LT(r.seconds, 10.0) << rate;
    EXPECT_THAT(r.err, HasSubstr("--timeout-ms")) << rate;
  }
  // a delay past the timeout hung for 71 minutes
  Result r = tilemoe("run --tokens 8 --hidden 16 --ffn-hidden 16 --delay-us 4294967295", 60);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("lower --delay-us or raise --timeout-ms"));
  // the timeout overflowed nanoseconds and was then called "not positive"
  for (const std::string timeout : {"86400001", "9300000000000", "9223372036854775807"}) {
    r = tilemoe("run --tokens 8 --hidden 16 --ffn-hidden 16 --timeout-ms " + timeout, 60);
    EXPECT_EQ(r.code, 2) << timeout << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("is more than a day: use at most 86400000")) << timeout;
  }
}

// Class 3: a rank slow in its own compute was reported as "rank 0 waits for rank 0".
TEST_F(BadInput, ARankSlowInItsOwnWorkIsNotCalledAStalledPeer) {
  const Result r = tilemoe("run --ranks 1 --experts 8 --tokens 64 --hidden 16 --ffn-hidden 16 --strategy sequential "
                           "--link-mbps 0 --timeout-ms 100 --delay-us 99000", 60);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("waits for its own work"));
  EXPECT_THAT(r.err, HasSubstr("raise --timeout-ms"));
  EXPECT_THAT(r.err, Not(HasSubstr("waits for rank 0")));
}

// Class 4: the trace was written before the step was checked, so a failed run left it behind.
TEST_F(BadInput, AFailedRunLeavesNeitherOutputNorTrace) {
  // finite fp32 inputs whose expert outputs overflow: every strategy agrees, the output is not
  // finite, the run fails after the step (bad input: exit 2, saying so)
  const std::string inputs = write_inputs("huge.safetensors", 16, [](std::vector<float>& x) {
    for (float& v : x) v = 3e38f;
  });
  const Result r = tilemoe("run --dtype fp32" + kLayer + "--ffn-hidden 16 --inputs " + inputs + " --output " + path("out.safetensors") +
                           " --trace " + path("trace.json"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("overflow fp32 in the expert FFN"));
  EXPECT_FALSE(fs::exists(path("out.safetensors")));
  EXPECT_FALSE(fs::exists(path("trace.json")));
  for (const auto& entry : fs::directory_iterator(dir_)) EXPECT_THAT(entry.path().filename().string(), Not(HasSubstr(".tmp")));
}

// Class 4: --output and --trace could name one file; --output could name a device node or a
// FIFO, which the rename replaced by a regular file.
TEST_F(BadInput, OutputAndTracePathsThatCannotTakeAFileAreRefusedBeforeTheStep) {
  const std::string run = "run --tokens 8 --hidden 16 --ffn-hidden 16 ";
  Result r = tilemoe(run + "--output " + path("same") + " --trace " + dir_.string() + "/./same");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("name the same file"));
  EXPECT_FALSE(fs::exists(path("same")));

  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  r = tilemoe(run + "--output " + path("fifo"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("is a FIFO, not a regular file"));
  EXPECT_TRUE(fs::is_fifo(path("fifo")));

  fs::create_directory(path("directory"));
  r = tilemoe(run + "--trace " + path("directory"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("is a directory, not a regular file"));

  // a device node of our own, not /dev/null: were the check ever lost, a run as root would
  // replace the node it names
  if (::geteuid() == 0) {
    ASSERT_EQ(::mknod(path("null").c_str(), S_IFCHR | 0666, ::makedev(1, 3)), 0);
    r = tilemoe(run + "--output " + path("null"));
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("is a character device, not a regular file"));
    EXPECT_TRUE(fs::is_character_file(path("null")));
  }

  r = tilemoe(run + "--output " + path("absent/out.safetensors"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("does not exist"));
  EXPECT_THAT(r.out, Not(HasSubstr("sequential"))) << "refused before the step ran";
}

// Class 5: sizes whose buffers cannot exist ended as exit 1 "internal error: std::bad_alloc";
// sizes that fit each allocation but not the machine grew until the kernel killed the process.
TEST_F(BadInput, AStepThatCannotFitIsRefusedWithTheSizeItNeeds) {
  Result r = tilemoe("run --tokens 1000000000000 --hidden 8 --ffn-hidden 8", 60);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("this step needs about"));
  EXPECT_THAT(r.err, HasSubstr("more than the memory available on this machine"));
  EXPECT_THAT(r.err, Not(HasSubstr("internal error")));
  EXPECT_LT(r.seconds, 20.0);

  // the default step needs some tens of MiB: refused under 1 MiB, with the parts named
  r = tilemoe("run --max-memory 1M", 60);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("more than --max-memory (1.0 MiB)"));
  EXPECT_THAT(r.err, HasSubstr("expert weights 21.0 MiB"));  // 8 experts x 3 x 256 x 896 fp32
  EXPECT_THAT(r.out, Not(HasSubstr("sequential"))) << "refused before the step ran";
  r = tilemoe("run --tokens 16 --hidden 16 --ffn-hidden 16 --max-memory 1G", 60);
  EXPECT_EQ(r.code, 0) << r.err;

  for (const std::string bad : {"abc", "-1G", "0", "12Q", "nan", "1e30G"}) {
    r = tilemoe("run --tokens 8 --hidden 16 --ffn-hidden 16 --max-memory " + bad, 60);
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("--max-memory '" + bad + "'")) << bad;
  }
}

// Class 9 (the part the CLI decides, also in a CPU-only build): --silent-rank with --dispatch
// host was silently ignored on the GPU and the run passed.
TEST_F(BadInput, AFaultInjectionThatCannotActIsRefused) {
  const Result r = tilemoe("run --backend cuda --ranks 2 --experts 4 --silent-rank 0 --dispatch host");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--dispatch host does not use"));
}
