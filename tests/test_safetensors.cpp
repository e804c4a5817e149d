// Tests of the safetensors parser and writer: round trips, exact fp32 conversions, the
// writer's all-or-nothing behaviour, and that every corruption is a clean BadInput.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <ostream>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tilemoe/dtype.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/safetensors.hpp"

namespace {

namespace fs = std::filesystem;
namespace st = tilemoe::safetensors;

// A fresh directory under the system temp dir, removed with everything in it.
class TemporaryDirectory {
 public:
  TemporaryDirectory() {
    static std::atomic<int> counter{0};
    for (;;) {
      path_ =
          fs::temp_directory_path() / ("tilemoe_safetensors_test_" + std::to_string(::getpid()) +
                                       "_" + std::to_string(counter++));
      if (fs::create_directory(path_)) break;  // false: left over from another run
    }
  }
  TemporaryDirectory(const TemporaryDirectory&) = delete;
  TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;
  ~TemporaryDirectory() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // Names of everything in the directory, to prove that no temporary was left behind.
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(path_)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  fs::path path_;
};

std::vector<std::byte> to_bytes(std::string_view text) {
  const auto* begin = reinterpret_cast<const std::byte*>(text.data());
  return {begin, begin + text.size()};
}

template <typename T>
std::span<const std::byte> raw_bytes(const std::vector<T>& values) {
  return std::as_bytes(std::span<const T>(values));
}

// A safetensors file from a header text (sent as is, no padding) and a data section.
std::vector<std::byte> make_file(std::string_view header, std::size_t data_bytes = 0,
                                 std::uint64_t header_length_override = 0) {
  std::uint64_t length = header_length_override != 0 ? header_length_override : header.size();
  std::vector<std::byte> bytes;
  for (int i = 0; i < 8; ++i) {
    bytes.push_back(static_cast<std::byte>(length & 0xffu));
    length >>= 8;
  }
  const std::vector<std::byte> header_bytes = to_bytes(header);
  bytes.insert(bytes.end(), header_bytes.begin(), header_bytes.end());
  for (std::size_t i = 0; i < data_bytes; ++i) bytes.push_back(static_cast<std::byte>(i));
  return bytes;
}

std::vector<std::byte> read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> chars{std::istreambuf_iterator<char>(in), {}};
  const auto* begin = reinterpret_cast<const std::byte*>(chars.data());
  return {begin, begin + chars.size()};
}

// Success iff `action` throws a tilemoe::Error of kind BadInput whose message contains
// every fragment.
template <typename Action>
::testing::AssertionResult throws_bad_input(Action&& action,
                                            const std::vector<std::string>& fragments) {
  try {
    action();
  } catch (const tilemoe::Error& error) {
    if (error.kind() != tilemoe::ErrorKind::BadInput) {
      return ::testing::AssertionFailure() << "an Error of another kind: " << error.what();
    }
    const std::string message = error.what();
    for (const std::string& fragment : fragments) {
      if (message.find(fragment) == std::string::npos) {
        return ::testing::AssertionFailure()
               << "message \"" << message << "\" lacks \"" << fragment << "\"";
      }
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& error) {
    return ::testing::AssertionFailure() << "a foreign exception: " << error.what();
  }
  return ::testing::AssertionFailure() << "nothing thrown";
}

std::vector<std::uint16_t> to_bf16_bits(const std::vector<float>& values) {
  std::vector<std::uint16_t> bits;
  for (const float value : values) bits.push_back(tilemoe::float_to_bf16_bits(value));
  return bits;
}

// One file of every kind the round trip covers: F32, BF16, a zero-row tensor, a scalar
// and metadata.
struct SampleTensors {
  std::vector<float> w1_values{1.0f, -2.5f, 3.25f, 0.0f, -0.0f, 1e-30f};
  std::vector<float> w2_values{0.1f, 0.2f, -0.3f, 1000.5f, 3.14159f, -65504.0f};
  std::vector<std::uint16_t> w2_bits = to_bf16_bits(w2_values);
  std::vector<float> scale_value{0.5f};
  std::vector<st::TensorToWrite> tensors{
      {"experts.0.w1", st::ElementType::F32, {2, 3}, raw_bytes(w1_values)},
      {"experts.0.empty", st::ElementType::F32, {0, 4}, {}},
      {"experts.0.w2", st::ElementType::BF16, {3, 2}, raw_bytes(w2_bits)},
      {"scale", st::ElementType::F32, {}, raw_bytes(scale_value)},
  };
  std::map<std::string, std::string> metadata{{"format", "pt"}, {"tilemoe.layer", "0"}};
};

TEST(SafetensorsElementType, NamesAndSizesFollowTheSpec) {
  const std::vector<std::tuple<st::ElementType, std::string_view, std::size_t>> expected{
      {st::ElementType::F64, "F64", 8}, {st::ElementType::F32, "F32", 4},
      {st::ElementType::F16, "F16", 2}, {st::ElementType::BF16, "BF16", 2},
      {st::ElementType::I64, "I64", 8}, {st::ElementType::I32, "I32", 4},
      {st::ElementType::I16, "I16", 2}, {st::ElementType::I8, "I8", 1},
      {st::ElementType::U8, "U8", 1},   {st::ElementType::BOOL, "BOOL", 1},
  };
  for (const auto& [type, name, size] : expected) {
    EXPECT_EQ(st::element_type_name(type), name);
    EXPECT_EQ(st::element_size(type), size) << name;
  }
}

TEST(SafetensorsHeaderOnly, ReadsEachTensorOnDemandAsOpenDoes) {
  TemporaryDirectory dir;
  const std::string path = dir.file("model.safetensors");
  const SampleTensors sample;
  st::write(path, sample.tensors, sample.metadata);
  const st::File whole = st::File::open(path);
  const st::File lazy = st::File::open_header(path);
  EXPECT_EQ(lazy.metadata(), sample.metadata);
  ASSERT_EQ(lazy.tensors().size(), whole.tensors().size());
  for (const st::TensorInfo& info : whole.tensors()) {
    const std::span<const std::byte> held = whole.bytes(info);
    EXPECT_EQ(lazy.read_bytes(lazy.get(info.name)), std::vector<std::byte>(held.begin(), held.end())) << info.name;
  }
  const std::vector<float> w2 = lazy.read_f32(lazy.get("experts.0.w2"));
  EXPECT_EQ(w2, whole.read_f32(whole.get("experts.0.w2")));
  // no view into data it does not hold
  EXPECT_THROW(lazy.bytes(lazy.get("experts.0.w1")), tilemoe::Error);

  // a file cut short after its header was read: the tensor past the end is a bad-input error
  fs::resize_file(path, fs::file_size(path) - 4);
  EXPECT_TRUE(throws_bad_input([&] { lazy.read_f32(lazy.get("scale")); }, {path, "file shrank", "\"scale\""}));
}

TEST(SafetensorsRoundTrip, F32Bf16ZeroRowsScalarAndMetadata) {
  TemporaryDirectory dir;
  const std::string path = dir.file("model.safetensors");
  const SampleTensors sample;
  st::write(path, sample.tensors, sample.metadata);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"model.safetensors"});

  const st::File file = st::File::open(path);
  EXPECT_EQ(file.source_name(), path);
  EXPECT_EQ(file.metadata(), sample.metadata);
  ASSERT_EQ(file.tensors().size(), 4u);
  // Data-offset order is the write order; the empty tensor sits at w2's offset and sorts
  // first because it ends first.
  std::vector<std::string> names;
  for (const st::TensorInfo& info : file.tensors()) names.push_back(info.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"experts.0.w1", "experts.0.empty", "experts.0.w2", "scale"}));

  const st::TensorInfo& w1 = file.get("experts.0.w1");
  EXPECT_EQ(w1.type, st::ElementType::F32);
  EXPECT_EQ(w1.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(w1.begin, 0u);
  EXPECT_EQ(w1.end, 24u);
  EXPECT_EQ(w1.elements(), 6);
  const std::vector<float> w1_read = file.read_f32(w1);
  ASSERT_EQ(w1_read.size(), sample.w1_values.size());
  for (std::size_t i = 0; i < w1_read.size(); ++i) {
    // Bitwise, so that -0.0 is told from 0.0.
    EXPECT_EQ(std::bit_cast<std::uint32_t>(w1_read[i]),
              std::bit_cast<std::uint32_t>(sample.w1_values[i]))
        << i;
  }

  const st::TensorInfo& empty = file.get("experts.0.empty");
  EXPECT_EQ(empty.shape, (std::vector<std::int64_t>{0, 4}));
  EXPECT_EQ(empty.elements(), 0);
  EXPECT_EQ(empty.begin, empty.end);
  EXPECT_TRUE(file.bytes(empty).empty());
  EXPECT_TRUE(file.read_f32(empty).empty());

  const st::TensorInfo& w2 = file.get("experts.0.w2");
  EXPECT_EQ(w2.type, st::ElementType::BF16);
  EXPECT_EQ(w2.shape, (std::vector<std::int64_t>{3, 2}));
  const std::span<const std::byte> w2_bytes = file.bytes(w2);
  ASSERT_EQ(w2_bytes.size(), 12u);
  EXPECT_EQ(std::memcmp(w2_bytes.data(), sample.w2_bits.data(), 12), 0);
  const std::vector<float> w2_read = file.read_f32(w2);
  ASSERT_EQ(w2_read.size(), 6u);
  for (std::size_t i = 0; i < w2_read.size(); ++i) {
    EXPECT_EQ(w2_read[i], tilemoe::round_to(tilemoe::DType::BF16, sample.w2_values[i])) << i;
  }

  const st::TensorInfo& scale = file.get("scale");
  EXPECT_TRUE(scale.shape.empty());
  EXPECT_EQ(scale.elements(), 1);
  EXPECT_EQ(file.read_f32(scale), std::vector<float>{0.5f});
}

TEST(SafetensorsRoundTrip, NoTensorsAndNoMetadata) {
  TemporaryDirectory dir;
  const std::string path = dir.file("empty.safetensors");
  st::write(path, {});
  // "{}" padded to 8 bytes.
  EXPECT_EQ(read_whole_file(path), make_file("{}      "));
  const st::File file = st::File::open(path);
  EXPECT_TRUE(file.tensors().empty());
  EXPECT_TRUE(file.metadata().empty());
}

TEST(SafetensorsWriter, HeaderIsSortedPaddedWithSpacesAndDataFollowsInOrder) {
  TemporaryDirectory dir;
  const std::string path = dir.file("layout.safetensors");
  const std::vector<float> b_values{1.0f};
  const std::vector<std::uint8_t> a_values{7, 9};
  st::write(path,
            {{"b", st::ElementType::F32, {1}, raw_bytes(b_values)},
             {"a", st::ElementType::U8, {2}, raw_bytes(a_values)}},
            {{"k", "v"}});

  const std::string expected_json =
      R"({"__metadata__":{"k":"v"},"a":{"data_offsets":[4,6],"dtype":"U8","shape":[2]},)"
      R"("b":{"data_offsets":[0,4],"dtype":"F32","shape":[1]}})";
  std::string padded = expected_json;
  padded.append((8 - padded.size() % 8) % 8, ' ');
  ASSERT_EQ(padded.size() % 8, 0u);
  std::vector<std::byte> expected = make_file(padded);
  const std::vector<std::byte> data{std::byte{0x00}, std::byte{0x00}, std::byte{0x80},
                                    std::byte{0x3f}, std::byte{7},    std::byte{9}};
  expected.insert(expected.end(), data.begin(), data.end());
  EXPECT_EQ(read_whole_file(path), expected);
}

TEST(SafetensorsWriter, ReplacesAnExistingFile) {
  TemporaryDirectory dir;
  const std::string path = dir.file("model.safetensors");
  const std::vector<float> old_values{1.0f, 2.0f};
  const std::vector<float> new_values{3.0f};
  st::write(path, {{"old", st::ElementType::F32, {2}, raw_bytes(old_values)}});
  st::write(path, {{"new", st::ElementType::F32, {1}, raw_bytes(new_values)}});
  const st::File file = st::File::open(path);
  EXPECT_EQ(file.find("old"), nullptr);
  EXPECT_EQ(file.read_f32(file.get("new")), new_values);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"model.safetensors"});
}

TEST(SafetensorsWriter, MissingDirectoryLeavesNothingBehind) {
  TemporaryDirectory dir;
  const std::string path = (dir.path() / "no_such_dir" / "model.safetensors").string();
  const std::vector<float> values{1.0f};
  EXPECT_TRUE(throws_bad_input(
      [&] {
        st::write(path, {{"w", st::ElementType::F32, {1}, raw_bytes(values)}});
      },
      {path, "cannot create the temporary file"}));
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(dir.entries().empty());
}

TEST(SafetensorsWriter, RejectedInputLeavesAnExistingFileUntouched) {
  TemporaryDirectory dir;
  const std::string path = dir.file("model.safetensors");
  const std::vector<float> values{1.0f, 2.0f, 3.0f};
  st::write(path, {{"w", st::ElementType::F32, {3}, raw_bytes(values)}});
  const std::vector<std::byte> before = read_whole_file(path);

  struct Rejected {
    std::vector<st::TensorToWrite> tensors;
    std::vector<std::string> fragments;
  };
  const std::vector<Rejected> rejected{
      {{{"w", st::ElementType::F32, {2, 2}, raw_bytes(values)}},
       {"tensor \"w\"", "data is 12 bytes but shape [2, 2] of F32 needs 16"}},
      {{{"w", st::ElementType::BF16, {3}, raw_bytes(values)}}, {"of BF16 needs 6"}},
      {{{"w", st::ElementType::F32, {3}, raw_bytes(values)},
        {"w", st::ElementType::F32, {3}, raw_bytes(values)}},
       {"tensor \"w\"", "given twice"}},
      {{{"", st::ElementType::F32, {3}, raw_bytes(values)}}, {"empty name"}},
      {{{"__metadata__", st::ElementType::F32, {3}, raw_bytes(values)}}, {"__metadata__"}},
      {{{"w", st::ElementType::F32, {-3}, raw_bytes(values)}}, {"negative dim"}},
      {{{"w", st::ElementType::F32, {std::int64_t{1} << 40, std::int64_t{1} << 40}, {}}},
       {"more elements than fit in int64"}},
      {{{"bad\xff", st::ElementType::F32, {3}, raw_bytes(values)}}, {"not valid UTF-8"}},
  };
  for (const Rejected& attempt : rejected) {
    std::vector<std::string> fragments = attempt.fragments;
    fragments.push_back(path);
    EXPECT_TRUE(throws_bad_input([&] { st::write(path, attempt.tensors); }, fragments));
    EXPECT_EQ(read_whole_file(path), before);
    EXPECT_EQ(dir.entries(), std::vector<std::string>{"model.safetensors"});
  }
  // Invalid UTF-8 in metadata is refused as well.
  EXPECT_TRUE(throws_bad_input(
      [&] {
        st::write(path, {{"w", st::ElementType::F32, {3}, raw_bytes(values)}}, {{"key", "\xc3"}});
      },
      {"not valid UTF-8"}));
  EXPECT_EQ(read_whole_file(path), before);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"model.safetensors"});
}

TEST(SafetensorsWriter, FailedRenameRemovesTheTemporary) {
  TemporaryDirectory dir;
  // A non-empty directory at the path: the temporary is written, the rename fails.
  const std::string path = dir.file("occupied");
  fs::create_directory(path);
  fs::create_directory(dir.path() / "occupied" / "keep");
  const std::vector<float> values{1.0f};
  EXPECT_TRUE(throws_bad_input(
      [&] {
        st::write(path, {{"w", st::ElementType::F32, {1}, raw_bytes(values)}});
      },
      {path, "cannot rename"}));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"occupied"});
  EXPECT_TRUE(fs::is_directory(dir.path() / "occupied" / "keep"));
}

TEST(SafetensorsReadF32, Bf16ConvertsExactly) {
  const std::vector<std::pair<std::uint16_t, float>> cases{
      {0x3f80, 1.0f},
      {0xc040, -3.0f},
      {0x3fc0, 1.5f},
      {0x3dcd, 0.10009765625f},
      {0x7f7f, 3.38953139e38f},                     // largest finite bf16
      {0x0080, std::numeric_limits<float>::min()},  // smallest normal, 2^-126
      {0x0001, std::ldexp(1.0f, -133)},             // smallest subnormal
      {0x7f80, std::numeric_limits<float>::infinity()},
      {0xff80, -std::numeric_limits<float>::infinity()},
      {0x8000, -0.0f},
  };
  std::vector<std::uint16_t> bits;
  for (const auto& [pattern, unused] : cases) bits.push_back(pattern);
  bits.push_back(0x7fc1);  // a NaN
  const std::vector<std::byte> file_bytes = [&] {
    const std::string header = R"({"v":{"dtype":"BF16","shape":[11],"data_offsets":[0,22]}})";
    std::vector<std::byte> bytes = make_file(header);
    const auto data = raw_bytes(bits);
    bytes.insert(bytes.end(), data.begin(), data.end());
    return bytes;
  }();
  const st::File file = st::File::parse(file_bytes, "bf16.safetensors");
  const std::vector<float> values = file.read_f32(file.get("v"));
  ASSERT_EQ(values.size(), 11u);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(std::bit_cast<std::uint32_t>(values[i]),
              std::bit_cast<std::uint32_t>(cases[i].second))
        << "bf16 0x" << std::hex << cases[i].first;
  }
  EXPECT_TRUE(std::isnan(values[10]));
}

TEST(SafetensorsReadF32, F16ConvertsExactly) {
  const std::vector<std::pair<std::uint16_t, float>> cases{
      {0x3c00, 1.0f},
      {0xc000, -2.0f},
      {0x3555, 0.333251953125f},
      {0x7bff, 65504.0f},                  // largest finite half
      {0x0400, std::ldexp(1.0f, -14)},     // smallest normal
      {0x03ff, std::ldexp(1023.0f, -24)},  // largest subnormal
      {0x0001, std::ldexp(1.0f, -24)},     // smallest subnormal
      {0x8001, -std::ldexp(1.0f, -24)},
      {0x0000, 0.0f},
      {0x8000, -0.0f},
      {0x7c00, std::numeric_limits<float>::infinity()},
      {0xfc00, -std::numeric_limits<float>::infinity()},
  };
  std::vector<std::uint16_t> bits;
  for (const auto& [pattern, unused] : cases) bits.push_back(pattern);
  bits.push_back(0x7e00);  // a quiet NaN
  bits.push_back(0xfc01);  // a signalling NaN, negative
  std::vector<std::byte> file_bytes =
      make_file(R"({"h":{"dtype":"F16","shape":[2,7],"data_offsets":[0,28]}})");
  const auto data = raw_bytes(bits);
  file_bytes.insert(file_bytes.end(), data.begin(), data.end());
  const st::File file = st::File::parse(file_bytes, "f16.safetensors");
  const std::vector<float> values = file.read_f32(file.get("h"));
  ASSERT_EQ(values.size(), 14u);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(std::bit_cast<std::uint32_t>(values[i]),
              std::bit_cast<std::uint32_t>(cases[i].second))
        << "f16 0x" << std::hex << cases[i].first;
  }
  EXPECT_TRUE(std::isnan(values[12]));
  EXPECT_TRUE(std::isnan(values[13]));

  // Every half value converts exactly: converting back with the hardware-independent
  // rule (scale by powers of two) gives the same number.
  std::vector<std::uint16_t> all_finite;
  for (std::uint32_t pattern = 0; pattern < 0x10000; ++pattern) {
    if (((pattern >> 10) & 0x1f) != 0x1f) all_finite.push_back(static_cast<std::uint16_t>(pattern));
  }
  std::vector<std::byte> all_bytes =
      make_file(R"({"all":{"dtype":"F16","shape":[63488],"data_offsets":[0,126976]}})");
  const auto all_data = raw_bytes(all_finite);
  all_bytes.insert(all_bytes.end(), all_data.begin(), all_data.end());
  const st::File all_file = st::File::parse(all_bytes, "all.safetensors");
  const std::vector<float> all_values = all_file.read_f32(all_file.get("all"));
  ASSERT_EQ(all_values.size(), all_finite.size());
  for (std::size_t i = 0; i < all_finite.size(); ++i) {
    const std::uint16_t half = all_finite[i];
    const int exponent = (half >> 10) & 0x1f;
    const int mantissa = half & 0x3ff;
    const float magnitude = exponent == 0
                                ? std::ldexp(static_cast<float>(mantissa), -24)
                                : std::ldexp(static_cast<float>(1024 + mantissa), exponent - 25);
    const float expected = (half & 0x8000) != 0 ? -magnitude : magnitude;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(all_values[i]), std::bit_cast<std::uint32_t>(expected))
        << "f16 0x" << std::hex << half;
  }
}

TEST(SafetensorsReadF32, OtherTypesAreBadInput) {
  const std::vector<std::int32_t> values{1, 2};
  std::vector<std::byte> bytes =
      make_file(R"({"ids":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})");
  const auto data = raw_bytes(values);
  bytes.insert(bytes.end(), data.begin(), data.end());
  const st::File file = st::File::parse(bytes, "ids.safetensors");
  const st::TensorInfo& ids = file.get("ids");
  EXPECT_EQ(file.bytes(ids).size(), 8u);
  EXPECT_TRUE(throws_bad_input([&] { file.read_f32(ids); },
                               {"ids.safetensors", "tensor \"ids\"", "I32", "F32, BF16 and F16"}));
}

TEST(SafetensorsFile, FindAndGet) {
  const st::File file = st::File::parse(
      make_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8), "small.st");
  ASSERT_NE(file.find("w"), nullptr);
  EXPECT_EQ(file.find("w")->name, "w");
  EXPECT_EQ(file.find("missing"), nullptr);
  EXPECT_EQ(file.find(""), nullptr);
  EXPECT_TRUE(throws_bad_input([&] { file.get("missing"); }, {"small.st", "\"missing\""}));
}

TEST(SafetensorsFile, OpenErrorsNameThePath) {
  TemporaryDirectory dir;
  const std::string missing = dir.file("missing.safetensors");
  EXPECT_TRUE(throws_bad_input([&] { st::File::open(missing); }, {missing, "cannot open"}));
  EXPECT_TRUE(throws_bad_input([&] { st::File::open(dir.path().string()); },
                               {dir.path().string(), "not a regular file"}));
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_TRUE(throws_bad_input([&] { st::File::open(fifo); }, {fifo, "not a regular file"}));
  const std::string corrupt = dir.file("corrupt.safetensors");
  std::ofstream(corrupt, std::ios::binary) << "short";
  EXPECT_TRUE(throws_bad_input([&] { st::File::open(corrupt); }, {corrupt, "shorter"}));
}

TEST(SafetensorsFile, HolesAndZeroSizeTensorsInsideOthersAreTolerated) {
  // a: [0, 8), a hole [8, 16), b: [16, 24), and a zero-size tensor at offset 4, inside a,
  // which occupies no byte.
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"I16","shape":[2,2],"data_offsets":[16,24]},)"
                             R"("z":{"dtype":"F64","shape":[3,0],"data_offsets":[4,4]}})";
  const st::File file = st::File::parse(make_file(header, 24), "holes.st");
  std::vector<std::string> names;
  for (const st::TensorInfo& info : file.tensors()) names.push_back(info.name);
  EXPECT_EQ(names, (std::vector<std::string>{"a", "z", "b"}));
  const std::span<const std::byte> b = file.bytes(file.get("b"));
  ASSERT_EQ(b.size(), 8u);
  EXPECT_EQ(b[0], std::byte{16});  // make_file fills byte i of the data section with i
  EXPECT_EQ(b[7], std::byte{23});
}

TEST(SafetensorsFile, BytesAfterTheLastTensorAreRefused) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_TRUE(throws_bad_input([&] { st::File::parse(make_file(header, 12), "tail.st"); },
                               {"tail.st", "4 bytes after the last tensor's data", "ends at byte 8 of 12"}));
  EXPECT_TRUE(throws_bad_input([&] { st::File::parse(make_file("{}", 1), "empty.st"); }, {"1 bytes after"}));
  EXPECT_NO_THROW(st::File::parse(make_file(header, 8), "exact.st"));
}

TEST(SafetensorsFile, OpenChecksTheHeaderBeforeReadingTheData) {
  // a small valid header in front of 1 GiB (sparse: no disk, and no memory unless read)
  TemporaryDirectory dir;
  const std::string path = dir.file("huge.safetensors");
  const std::vector<float> values{1.0f, 2.0f};
  st::write(path, {{"a", st::ElementType::F32, {2}, raw_bytes(values)}});
  fs::resize_file(path, std::uintmax_t{1} << 30);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(throws_bad_input([&] { st::File::open(path); }, {path, "bytes after the last tensor's data"}));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500)) << "the data was read first";
  // and a header length past the end is found from the first 8 bytes alone
  std::ofstream(dir.file("lying.safetensors"), std::ios::binary)
      << std::string("\xff\xff\x00\x00\x00\x00\x00\x00{}", 10);
  EXPECT_TRUE(throws_bad_input([&] { st::File::open(dir.file("lying.safetensors")); }, {"header length 65535 is larger than the 2 bytes"}));
}

TEST(SafetensorsFile, ZeroElementTensorMayHaveHugeOtherDims) {
  const std::string header =
      R"({"z":{"dtype":"F32","shape":[0,1099511627776,4096],"data_offsets":[0,0]}})";
  const st::File file = st::File::parse(make_file(header), "zero.st");
  EXPECT_EQ(file.get("z").elements(), 0);
}

// One corrupt file per check of the parser, with a fragment its message must contain.
struct Corruption {
  std::string name;
  std::vector<std::byte> bytes;
  std::string fragment;
};

// gtest would print the bytes; the name says more.
void PrintTo(const Corruption& corruption, std::ostream* out) { *out << corruption.name; }

// Appends instead of chaining operator+, which trips g++ 12's false -Wrestrict warning.
std::string concat(std::initializer_list<std::string_view> parts) {
  std::string text;
  for (const std::string_view part : parts) text.append(part);
  return text;
}

// The header text of one tensor entry, the JSON values given as they are to appear.
std::string entry(std::string_view name, std::string_view dtype, std::string_view shape,
                  std::string_view offsets) {
  return concat({"\"", name, "\":{\"dtype\":", dtype, ",\"shape\":", shape,
                 ",\"data_offsets\":", offsets, "}"});
}

// A header object of the given entries.
std::string object_of(std::initializer_list<std::string> entries) {
  std::string text = "{";
  for (const std::string& one_entry : entries) {
    if (text.size() > 1) text += ',';
    text += one_entry;
  }
  return text + '}';
}

std::vector<Corruption> corruptions() {
  const auto one = [](std::string_view dtype, std::string_view shape, std::string_view offsets,
                      std::size_t data_bytes = 8) {
    return make_file(object_of({entry("w", dtype, shape, offsets)}), data_bytes);
  };
  const std::string valid_w = entry("w", "\"F32\"", "[2]", "[0,8]");
  return {
      {"ShorterThanTheLengthPrefix", to_bytes(std::string_view("\x02\0\0\0\0", 5)),
       "shorter than the 8-byte"},
      {"EmptyFile", {}, "file is 0 bytes"},
      {"HeaderLengthBeyondFile", make_file("{}", 0, 100), "header length 100 is larger than"},
      {"HeaderLengthOverLimit", make_file("{}", 0, (100u << 20) + 1), "limit of 100 MiB"},
      {"HeaderLengthMaxU64", make_file("{}", 0, std::numeric_limits<std::uint64_t>::max()),
       "limit of 100 MiB"},
      {"EmptyHeader", make_file("", 8), "not valid JSON"},
      {"NotJson", make_file("{nope}"), "not valid JSON"},
      {"TrailingGarbage", make_file("{} x"), "not valid JSON"},
      {"NulPadding", make_file(std::string("{}\0\0", 4)), "a NUL byte at offset 2"},
      {"NulBeforeGarbage", make_file(std::string("{}\0{]", 5)), "a NUL byte at offset 2"},
      {"InvalidUtf8", make_file("{\"w\xff\":1}"), "not valid JSON"},
      {"TooDeep", make_file(R"({"a":[[[[[[[[[[]]]]]]]]]]})"), "nests deeper than"},
      {"NotAnObject", make_file("[1,2]"), "not a JSON object but array"},
      {"EntryNotAnObject", make_file(R"({"w":3})"), "tensor \"w\": entry is not a JSON object"},
      {"EmptyName", make_file(object_of({entry("", "\"F32\"", "[2]", "[0,8]")}), 8), "empty name"},
      {"UnknownField",
       make_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", 8),
       "unknown field \"extra\""},
      {"MissingDtype", make_file(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8),
       "tensor \"w\": missing \"dtype\""},
      {"DtypeNotString", one("4", "[2]", "[0,8]"), "\"dtype\" is not a string"},
      {"UnknownDtype", one("\"F8_E4M3\"", "[2]", "[0,8]"), "unsupported dtype \"F8_E4M3\""},
      {"LowercaseDtype", one("\"f32\"", "[2]", "[0,8]"), "unsupported dtype \"f32\""},
      {"MissingShape", make_file(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", 8),
       "missing \"shape\""},
      {"ShapeNotArray", one("\"F32\"", "2", "[0,8]"), "\"shape\" is not an array"},
      {"ShapeNegative", one("\"F32\"", "[-2]", "[0,8]"), "shape entry #0 is negative (-2)"},
      {"ShapeFloat", one("\"F32\"", "[2.0]", "[0,8]"), "shape entry #0 is not an integer"},
      {"ShapeString", one("\"F32\"", "[1,\"2\"]", "[0,8]"), "shape entry #1 is not an integer"},
      {"ShapeBeyondU64", one("\"F32\"", "[18446744073709551616]", "[0,8]"),
       "shape entry #0 is not an integer"},
      {"ShapeBeyondInt64", one("\"U8\"", "[9223372036854775808]", "[0,8]"),
       "shape entry #0 (9223372036854775808) exceeds int64"},
      {"ElementCountOverflow", one("\"F32\"", "[4294967296,4294967296]", "[0,8]"),
       "more elements than fit in int64"},
      {"ByteSizeOverflow", one("\"F64\"", "[4611686018427387904]", "[0,8]"),
       "byte size that overflows u64"},
      {"MissingDataOffsets", make_file(R"({"w":{"dtype":"F32","shape":[2]}})", 8),
       "missing \"data_offsets\""},
      {"DataOffsetsNotArray", one("\"F32\"", "[2]", "8"), "not an array of two integers"},
      {"DataOffsetsOneEntry", one("\"F32\"", "[2]", "[8]"), "not an array of two integers"},
      {"DataOffsetsThreeEntries", one("\"F32\"", "[2]", "[0,8,16]"),
       "not an array of two integers"},
      {"DataOffsetsNegative", one("\"F32\"", "[2]", "[-1,7]"), "data_offsets begin is negative"},
      {"DataOffsetsFloat", one("\"F32\"", "[2]", "[0,8.0]"), "data_offsets end is not an integer"},
      {"DataOffsetsNull", one("\"F32\"", "[2]", "[0,null]"), "data_offsets end is not an integer"},
      {"BeginAfterEnd", one("\"F32\"", "[0]", "[8,0]"), "begin is after end"},
      {"EndBeyondDataSection", one("\"F32\"", "[4]", "[0,16]"),
       "end is beyond the data section of 8 bytes"},
      {"HugeEndBeyondDataSection",
       one("\"U8\"", "[1]", "[18446744073709551614,18446744073709551615]"),
       "end is beyond the data section"},
      {"SizeMismatch", one("\"F32\"", "[3]", "[0,8]"),
       "span 8 bytes but shape [3] of F32 needs 12 bytes"},
      {"Overlap",
       make_file(object_of({entry("a", "\"F32\"", "[2]", "[0,8]"),
                            entry("b", "\"F32\"", "[2]", "[4,12]")}),
                 12),
       "tensors \"a\" [0, 8) and \"b\" [4, 12) overlap"},
      {"SameRangeTwice",
       make_file(object_of({entry("a", "\"F32\"", "[2]", "[0,8]"),
                            entry("b", "\"I32\"", "[2]", "[0,8]")}),
                 8),
       "overlap"},
      {"OverlapPastAHole",
       make_file(
           object_of({entry("a", "\"U8\"", "[32]", "[0,32]"), entry("b", "\"U8\"", "[4]", "[8,12]"),
                      entry("c", "\"U8\"", "[4]", "[16,20]")}),
           32),
       "overlap"},
      {"DuplicateTensorName", make_file(object_of({valid_w, valid_w}), 8),
       "duplicate tensor name \"w\""},
      {"DuplicateFieldInEntry",
       make_file(R"({"w":{"dtype":"F32","dtype":"I32","shape":[2],"data_offsets":[0,8]}})", 8),
       "duplicate key \"dtype\""},
      {"DuplicateMetadataKey", make_file(R"({"__metadata__":{"k":"a","k":"b"}})"),
       "duplicate key \"k\""},
      {"DuplicateMetadata", make_file(R"({"__metadata__":{},"__metadata__":{}})"),
       "duplicate \"__metadata__\""},
      {"MetadataNotObject", make_file(R"({"__metadata__":["k"]})"),
       "\"__metadata__\" is not a JSON object but array"},
      {"MetadataValueNotString", make_file(R"({"__metadata__":{"k":1}})"),
       "\"__metadata__\" entry \"k\" is not a string but number"},
      {"MetadataValueNested", make_file(R"({"__metadata__":{"k":{"x":"y"}}})"),
       "\"__metadata__\" entry \"k\" is not a string but object"},
  };
}

class SafetensorsCorruption : public ::testing::TestWithParam<Corruption> {};

TEST_P(SafetensorsCorruption, IsBadInputNamingTheFileAndTheProblem) {
  const Corruption& corruption = GetParam();
  EXPECT_TRUE(throws_bad_input([&] { st::File::parse(corruption.bytes, "corrupt.safetensors"); },
                               {"corrupt.safetensors: ", corruption.fragment}));
}

INSTANTIATE_TEST_SUITE_P(AllChecks, SafetensorsCorruption, ::testing::ValuesIn(corruptions()),
                         [](const ::testing::TestParamInfo<Corruption>& info) {
                           return info.param.name;
                         });

// A valid file written by st::write, for the damage tests.
std::vector<std::byte> sample_file_bytes() {
  TemporaryDirectory dir;
  const std::string path = dir.file("sample.safetensors");
  const SampleTensors sample;
  st::write(path, sample.tensors, sample.metadata);
  return read_whole_file(path);
}

// Every malformed input is BadInput: so any other outcome (another exception, a
// crash, a sanitizer report) is a bug.
enum class Outcome { Parsed, BadInput, Other };

Outcome parse_outcome(std::vector<std::byte> bytes) {
  try {
    const st::File file = st::File::parse(std::move(bytes), "damaged.safetensors");
    // Touch everything a caller might: it must all stay within bounds.
    for (const st::TensorInfo& info : file.tensors()) {
      (void)file.bytes(info);
      (void)info.elements();
    }
    return Outcome::Parsed;
  } catch (const tilemoe::Error& error) {
    return error.kind() == tilemoe::ErrorKind::BadInput ? Outcome::BadInput : Outcome::Other;
  } catch (...) {
    return Outcome::Other;
  }
}

TEST(SafetensorsDamage, TruncationAtEveryLengthIsBadInput) {
  const std::vector<std::byte> full = sample_file_bytes();
  ASSERT_EQ(parse_outcome(full), Outcome::Parsed);
  for (std::size_t length = 0; length < full.size(); ++length) {
    const std::vector<std::byte> truncated(full.begin(),
                                           full.begin() + static_cast<std::ptrdiff_t>(length));
    ASSERT_EQ(parse_outcome(truncated), Outcome::BadInput) << "truncated to " << length;
  }
}

TEST(SafetensorsDamage, ChangingAnyByteParsesOrIsBadInput) {
  const std::vector<std::byte> original = sample_file_bytes();
  for (std::size_t position = 0; position < original.size(); ++position) {
    for (const std::uint8_t replacement : {0x00, 0x01, 0x22, 0x2c, 0x30, 0x39, 0x5d, 0x7d, 0xff}) {
      std::vector<std::byte> damaged = original;
      damaged[position] = static_cast<std::byte>(replacement);
      ASSERT_NE(parse_outcome(damaged), Outcome::Other)
          << "byte " << position << " set to " << int{replacement};
    }
  }
}

}  // namespace
