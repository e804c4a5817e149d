// safetensors parser and writer; see include/tilemoe/safetensors.hpp for the format and
// for where this parser is stricter or more lenient than the reference implementation.
#include "tilemoe/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <system_error>
#include <tuple>
#include <utility>

#include "tilemoe/dtype.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::safetensors {
namespace {

using Json = nlohmann::json;

constexpr std::size_t kLengthPrefixBytes = 8;
// The reference implementation caps the header at 100 MB; we cap at 100 MiB. Without a
// cap a corrupt length would make us parse (and allocate for) a multi-GB "header".
constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;
// A valid header nests three levels deep (object > entry > shape array). Anything much
// deeper is garbage; rejecting it early bounds the parser's work and memory.
constexpr int kMaxJsonDepth = 8;
constexpr std::string_view kMetadataKey = "__metadata__";

struct ElementTypeTraits {
  ElementType type;
  std::string_view name;
  std::size_t size;
};

constexpr std::array<ElementTypeTraits, 10> kElementTypes{{
    {ElementType::F64, "F64", 8},
    {ElementType::F32, "F32", 4},
    {ElementType::F16, "F16", 2},
    {ElementType::BF16, "BF16", 2},
    {ElementType::I64, "I64", 8},
    {ElementType::I32, "I32", 4},
    {ElementType::I16, "I16", 2},
    {ElementType::I8, "I8", 1},
    {ElementType::U8, "U8", 1},
    {ElementType::BOOL, "BOOL", 1},
}};

const ElementTypeTraits& traits_of(ElementType type) {
  for (const ElementTypeTraits& traits : kElementTypes) {
    if (traits.type == type) return traits;
  }
  throw_internal("safetensors: element type " + std::to_string(static_cast<int>(type)) +
                 " is not one of the enum's values");
}

std::optional<ElementType> element_type_from_name(std::string_view name) {
  for (const ElementTypeTraits& traits : kElementTypes) {
    if (traits.name == name) return traits.type;
  }
  return std::nullopt;
}

// A string as a JSON literal: quoted, with control characters escaped and invalid
// UTF-8 replaced, so that a hostile tensor name cannot garble an error message; a name of
// megabytes is cut (its head tells which tensor it is).
std::string json_quoted(std::string_view text) {
  constexpr std::size_t kMaxChars = 200;
  if (text.size() <= kMaxChars) return Json(std::string(text)).dump(-1, ' ', false, Json::error_handler_t::replace);
  return Json(std::string(text.substr(0, kMaxChars))).dump(-1, ' ', false, Json::error_handler_t::replace) + "... (" +
         std::to_string(text.size()) + " bytes)";
}

// Text from the file for an error message: nlohmann's messages quote the bytes last
// read, which may be anything, and a dumped JSON value may be megabytes long.
std::string printable(std::string_view text) {
  constexpr std::size_t kMaxChars = 160;
  std::string result(text.substr(0, kMaxChars));
  for (char& c : result) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte >= 0x7f) c = '?';
  }
  if (text.size() > kMaxChars) result += "...";
  return result;
}

std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::nullopt;
  return a * b;
}

// The element count of a shape, or nullopt if a dim is negative or the non-zero dims
// multiply past int64. Overflow is judged without the zero dims so that every stride a
// consumer computes from the shape (a product of some of its dims) fits in int64.
std::optional<std::int64_t> element_count(const std::vector<std::int64_t>& shape) {
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  std::uint64_t product_of_nonzero_dims = 1;
  bool has_zero_dim = false;
  for (const std::int64_t dim : shape) {
    if (dim < 0) return std::nullopt;
    if (dim == 0) {
      has_zero_dim = true;
      continue;
    }
    const auto product = checked_mul(product_of_nonzero_dims, static_cast<std::uint64_t>(dim));
    if (!product || *product > kMax) return std::nullopt;
    product_of_nonzero_dims = *product;
  }
  return has_zero_dim ? 0 : static_cast<std::int64_t>(product_of_nonzero_dims);
}

// Explicit little-endian decoding keeps the parser correct on any host.
std::uint64_t load_u64_le(const std::byte* bytes) {
  std::uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | std::to_integer<std::uint64_t>(bytes[i]);
  return value;
}

std::uint32_t load_u32_le(const std::byte* bytes) {
  std::uint32_t value = 0;
  for (int i = 3; i >= 0; --i) value = (value << 8) | std::to_integer<std::uint32_t>(bytes[i]);
  return value;
}

std::uint16_t load_u16_le(const std::byte* bytes) {
  return static_cast<std::uint16_t>(std::to_integer<std::uint16_t>(bytes[0]) |
                                    (std::to_integer<std::uint16_t>(bytes[1]) << 8));
}

// IEEE binary16 -> binary32. Exact: every half value, subnormals included, is a float.
float f16_bits_to_float(std::uint16_t half) {
  const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000u) << 16;
  const std::uint32_t exponent = (half >> 10) & 0x1fu;
  std::uint32_t mantissa = half & 0x3ffu;
  std::uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf, or NaN with its payload
  } else if (exponent != 0) {
    bits = sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal, mantissa * 2^-24: shift the leading 1 up to the implicit-bit position;
    // as a float it is a normal number.
    std::uint32_t shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    bits = sign | ((127 - 14 - shift) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

std::string errno_text(int error_number) {
  return std::error_code(error_number, std::generic_category()).message();
}

// Parses one header; every failure is a bad-input error prefixed with the source name.
class HeaderParser {
 public:
  HeaderParser(const std::string& source_name, std::uint64_t data_section_bytes)
      : source_name_(source_name), data_section_bytes_(data_section_bytes) {}

  void parse(std::string_view header_text, std::vector<TensorInfo>& tensors,
             std::map<std::string, std::string>& metadata) const {
    const Json header = parse_json(header_text);
    if (!header.is_object()) {
      fail(std::string("header is not a JSON object but ") + header.type_name());
    }
    for (const auto& [key, value] : header.items()) {
      if (key == kMetadataKey) {
        metadata = parse_metadata(value);
      } else {
        tensors.push_back(parse_tensor(key, value));
      }
    }
    // Order by data offset (the documented order of tensors()), then check overlaps.
    std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
      return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
    });
    check_no_overlaps(tensors);
    check_nothing_after_the_last_tensor(tensors);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw_bad_input(source_name_ + ": " + what);
  }

  [[noreturn]] void fail_tensor(const std::string& name, const std::string& what) const {
    fail("tensor " + json_quoted(name) + ": " + what);
  }

  Json parse_json(std::string_view text) const {
    // nlohmann's lexer takes a NUL byte for the end of the input and would ignore all
    // after it. JSON never has a raw NUL (not even in strings), so one is an error.
    if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos) {
      fail("header is not valid JSON: a NUL byte at offset " + std::to_string(nul));
    }
    // nlohmann keeps the last of duplicate keys; a file whose meaning depends on that is
    // ambiguous (other readers may keep the first), so the callback rejects duplicates.
    // One set of seen keys per open object; arrays need none.
    std::vector<std::set<std::string>> keys_of_open_objects;
    const auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
      switch (event) {
        case Json::parse_event_t::object_start:
        case Json::parse_event_t::array_start:
          if (depth >= kMaxJsonDepth) {
            fail("header nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
          }
          if (event == Json::parse_event_t::object_start) keys_of_open_objects.emplace_back();
          break;
        case Json::parse_event_t::object_end:
          keys_of_open_objects.pop_back();
          break;
        case Json::parse_event_t::key: {
          if (keys_of_open_objects.empty())
            throw_internal("safetensors: a JSON key outside an object");
          const auto& key = parsed.get_ref<const std::string&>();
          if (!keys_of_open_objects.back().insert(key).second) {
            if (depth == 1 && key == kMetadataKey) fail("duplicate \"__metadata__\" entry");
            if (depth == 1) fail("duplicate tensor name " + json_quoted(key));
            fail("duplicate key " + json_quoted(key) + " in one JSON object of the header");
          }
          break;
        }
        default:
          break;
      }
      return true;
    };
    try {
      return Json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                         /*ignore_comments=*/false);
    } catch (const Json::exception& error) {
      fail("header is not valid JSON: " + printable(error.what()));
    }
  }

  std::map<std::string, std::string> parse_metadata(const Json& value) const {
    if (!value.is_object()) {
      fail(std::string("\"__metadata__\" is not a JSON object but ") + value.type_name());
    }
    std::map<std::string, std::string> metadata;
    for (const auto& [key, entry] : value.items()) {
      if (!entry.is_string()) {
        fail("\"__metadata__\" entry " + json_quoted(key) + " is not a string but " +
             entry.type_name());
      }
      metadata.emplace(key, entry.get<std::string>());
    }
    return metadata;
  }

  const Json& field(const std::string& name, const Json& entry, const char* key) const {
    const auto found = entry.find(key);
    if (found == entry.end()) fail_tensor(name, std::string("missing \"") + key + "\"");
    return *found;
  }

  // A JSON integer >= 0 (nlohmann stores it as unsigned or, for "-0", as signed).
  std::uint64_t non_negative_integer(const std::string& name, const Json& value,
                                     const std::string& what) const {
    if (value.is_number_unsigned()) return value.get<std::uint64_t>();
    if (value.is_number_integer()) {
      const auto signed_value = value.get<std::int64_t>();
      if (signed_value < 0) {
        fail_tensor(name, what + " is negative (" + std::to_string(signed_value) + ")");
      }
      return static_cast<std::uint64_t>(signed_value);
    }
    fail_tensor(name, what + " is not an integer but " + printable(value.dump()));
  }

  TensorInfo parse_tensor(const std::string& name, const Json& entry) const {
    if (name.empty()) fail("a tensor has an empty name");
    if (!entry.is_object()) {
      fail_tensor(name, std::string("entry is not a JSON object but ") + entry.type_name());
    }
    for (const auto& [key, unused] : entry.items()) {
      if (key != "dtype" && key != "shape" && key != "data_offsets") {
        fail_tensor(name, "unknown field " + json_quoted(key) +
                              " (expected only dtype, shape and data_offsets)");
      }
    }
    TensorInfo info;
    info.name = name;

    const Json& dtype = field(name, entry, "dtype");
    if (!dtype.is_string()) {
      fail_tensor(name, std::string("\"dtype\" is not a string but ") + dtype.type_name());
    }
    const auto type = element_type_from_name(dtype.get_ref<const std::string&>());
    if (!type)
      fail_tensor(name, "unknown or unsupported dtype " + json_quoted(dtype.get<std::string>()));
    info.type = *type;

    const Json& shape = field(name, entry, "shape");
    if (!shape.is_array()) {
      fail_tensor(name, std::string("\"shape\" is not an array but ") + shape.type_name());
    }
    constexpr auto kMaxDim = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    for (std::size_t i = 0; i < shape.size(); ++i) {
      const std::string what = "shape entry #" + std::to_string(i);
      const std::uint64_t dim = non_negative_integer(name, shape[i], what);
      if (dim > kMaxDim) fail_tensor(name, what + " (" + std::to_string(dim) + ") exceeds int64");
      info.shape.push_back(static_cast<std::int64_t>(dim));
    }
    const auto elements = element_count(info.shape);
    if (!elements) {
      fail_tensor(name, "shape " + shape_text(info.shape) + " has more elements than fit in int64");
    }
    const std::size_t size = element_size(info.type);
    const auto expected_bytes = checked_mul(static_cast<std::uint64_t>(*elements), size);
    if (!expected_bytes) {
      fail_tensor(name, "shape " + shape_text(info.shape) + " of " + dtype.get<std::string>() +
                            " has a byte size that overflows u64");
    }

    const Json& offsets = field(name, entry, "data_offsets");
    if (!offsets.is_array() || offsets.size() != 2) {
      fail_tensor(name, "\"data_offsets\" is not an array of two integers but " +
                            printable(offsets.dump()));
    }
    info.begin = non_negative_integer(name, offsets[0], "data_offsets begin");
    info.end = non_negative_integer(name, offsets[1], "data_offsets end");
    const std::string range =
        "data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) + "]";
    if (info.begin > info.end) fail_tensor(name, range + ": begin is after end");
    if (info.end > data_section_bytes_) {
      fail_tensor(name, range + ": end is beyond the data section of " +
                            std::to_string(data_section_bytes_) + " bytes");
    }
    if (info.end - info.begin != *expected_bytes) {
      fail_tensor(name, range + " span " + std::to_string(info.end - info.begin) +
                            " bytes but shape " + shape_text(info.shape) + " of " +
                            dtype.get<std::string>() + " needs " + std::to_string(*expected_bytes) +
                            " bytes");
    }
    return info;
  }

  // `tensors` sorted by begin. Zero-size tensors occupy no byte and overlap nothing.
  void check_no_overlaps(const std::vector<TensorInfo>& tensors) const {
    const TensorInfo* furthest = nullptr;  // the non-empty tensor reaching furthest so far
    for (const TensorInfo& tensor : tensors) {
      if (tensor.begin == tensor.end) continue;
      if (furthest != nullptr && tensor.begin < furthest->end) {
        fail("tensors " + json_quoted(furthest->name) + " [" + std::to_string(furthest->begin) +
             ", " + std::to_string(furthest->end) + ") and " + json_quoted(tensor.name) + " [" +
             std::to_string(tensor.begin) + ", " + std::to_string(tensor.end) +
             ") overlap in the data section");
      }
      if (furthest == nullptr || tensor.end > furthest->end) furthest = &tensor;
    }
  }

  // Bytes after the last tensor belong to nothing: a file cut short and padded, or two files
  // joined; the reference implementation refuses them too.
  void check_nothing_after_the_last_tensor(const std::vector<TensorInfo>& tensors) const {
    std::uint64_t end = 0;
    for (const TensorInfo& tensor : tensors) end = std::max(end, tensor.end);
    if (end < data_section_bytes_) {
      fail("the data section has " + std::to_string(data_section_bytes_ - end) + " bytes after the last tensor's data (which " +
           "ends at byte " + std::to_string(end) + " of " + std::to_string(data_section_bytes_) +
           "): the file is damaged or joined with another; save it again");
    }
  }

  const std::string& source_name_;
  std::uint64_t data_section_bytes_;
};

// The header length that the first 8 bytes of a file of `file_bytes` bytes give, checked
// against the limit and the file's size before any of the rest is read.
std::uint64_t checked_header_length(std::span<const std::byte> prefix, std::uint64_t file_bytes, const std::string& source) {
  if (file_bytes < kLengthPrefixBytes || prefix.size() < kLengthPrefixBytes) {
    throw_bad_input(source + ": file is " + std::to_string(file_bytes) + " bytes, shorter than the 8-byte header length");
  }
  const std::uint64_t header_bytes = load_u64_le(prefix.data());
  if (header_bytes > kMaxHeaderBytes) {
    throw_bad_input(source + ": header length " + std::to_string(header_bytes) + " is larger than the limit of 100 MiB");
  }
  const std::uint64_t bytes_after_prefix = file_bytes - kLengthPrefixBytes;
  if (header_bytes > bytes_after_prefix) {
    throw_bad_input(source + ": header length " + std::to_string(header_bytes) + " is larger than the " +
                    std::to_string(bytes_after_prefix) + " bytes that follow it");
  }
  return header_bytes;
}

// Reads exactly `out.size()` bytes at `offset` of a file that was `file_bytes` long when opened;
// `what` names what is read in the messages ("" for the file itself).
void read_exactly(int fd, std::span<std::byte> out, std::uint64_t offset, const std::string& path, std::uint64_t file_bytes,
                  const std::string& what = {}) {
  std::size_t filled = 0;
  while (filled < out.size()) {
    const ssize_t got = ::pread(fd, out.data() + filled, out.size() - filled, static_cast<off_t>(offset + filled));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw_bad_input(path + ": cannot read" + what + ": " + errno_text(errno));
    }
    if (got == 0) {
      throw_bad_input(path + ": file shrank while being read (it was " + std::to_string(file_bytes) + " bytes)" +
                      (what.empty() ? "" : ";" + what + " cannot be read"));
    }
    filled += static_cast<std::size_t>(got);
  }
}

// Owns a file descriptor.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now, reporting the error that a destructor would have to swallow: on some
  // file systems a failed write only shows up here.
  int close() {
    const int result = ::close(fd_);
    fd_ = -1;
    return result;
  }

 private:
  int fd_;
};

[[noreturn]] void fail_tensor_to_write(const std::string& path, const std::string& name,
                                       const std::string& what) {
  throw_bad_input(path + ": tensor " + json_quoted(name) + ": " + what);
}

}  // namespace

std::string printable_name(std::string_view name) { return json_quoted(name); }

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

std::string_view element_type_name(ElementType type) { return traits_of(type).name; }

std::size_t element_size(ElementType type) { return traits_of(type).size; }

std::int64_t TensorInfo::elements() const {
  const auto count = element_count(shape);
  if (!count) {
    throw_internal("safetensors: tensor " + json_quoted(name) + ": shape " + shape_text(shape) +
                   " has a negative dim or more elements than fit in int64");
  }
  return *count;
}

File File::open_header(const std::string& path) {
  // O_NONBLOCK so that a FIFO at the path is refused below instead of blocking here;
  // it changes nothing for a regular file.
  const int raw_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (raw_fd < 0) throw_bad_input(path + ": cannot open: " + errno_text(errno));
  auto fd = std::shared_ptr<const int>(new int(raw_fd), [](const int* owned) {
    ::close(*owned);
    delete owned;
  });
  struct stat status {};
  if (::fstat(*fd, &status) != 0) throw_bad_input(path + ": cannot stat: " + errno_text(errno));
  if (!S_ISREG(status.st_mode)) throw_bad_input(path + ": is not a regular file");
  const auto file_bytes = static_cast<std::uint64_t>(status.st_size);
  std::array<std::byte, kLengthPrefixBytes> prefix{};
  read_exactly(*fd, std::span<std::byte>(prefix).first(static_cast<std::size_t>(std::min<std::uint64_t>(file_bytes, kLengthPrefixBytes))),
               0, path, file_bytes);
  const std::uint64_t header_bytes = checked_header_length(prefix, file_bytes, path);
  File file;
  file.source_name_ = path;
  file.data_start_ = kLengthPrefixBytes + static_cast<std::size_t>(header_bytes);
  std::string header(static_cast<std::size_t>(header_bytes), '\0');
  read_exactly(*fd, std::as_writable_bytes(std::span<char>(header)), kLengthPrefixBytes, path, file_bytes);
  HeaderParser(file.source_name_, file_bytes - file.data_start_).parse(header, file.tensors_, file.metadata_);
  for (std::size_t i = 0; i < file.tensors_.size(); ++i) file.index_by_name_.emplace(file.tensors_[i].name, i);
  file.header_only_fd_ = std::move(fd);
  file.header_only_file_bytes_ = file_bytes;
  return file;
}

File File::open(const std::string& path) {
  // The header first, checked whole against the file's size, before the data section is read:
  // a huge file with a small valid header used to be read into memory entirely first.
  File file = open_header(path);
  // Only now, with every tensor's range checked and nothing after the last, the data. The
  // prefix and header stay in front of it so that offsets match File::parse's layout.
  const std::uint64_t file_bytes = file.header_only_file_bytes_;
  if (file_bytes > std::numeric_limits<std::size_t>::max()) throw_bad_input(path + ": file is too large to read");
  file.file_bytes_.resize(static_cast<std::size_t>(file_bytes));
  read_exactly(*file.header_only_fd_, file.file_bytes_, 0, path, file_bytes);
  file.header_only_fd_.reset();
  return file;
}

File File::parse(std::vector<std::byte> bytes, std::string source_name) {
  File file;
  file.source_name_ = std::move(source_name);
  file.file_bytes_ = std::move(bytes);
  const std::string& source = file.source_name_;
  const std::vector<std::byte>& all = file.file_bytes_;

  const std::uint64_t header_bytes = checked_header_length(all, all.size(), source);
  file.data_start_ = kLengthPrefixBytes + static_cast<std::size_t>(header_bytes);
  const std::string_view header_text(reinterpret_cast<const char*>(all.data() + kLengthPrefixBytes),
                                     static_cast<std::size_t>(header_bytes));

  HeaderParser(source, all.size() - file.data_start_)
      .parse(header_text, file.tensors_, file.metadata_);
  for (std::size_t i = 0; i < file.tensors_.size(); ++i) {
    file.index_by_name_.emplace(file.tensors_[i].name, i);
  }
  return file;
}

const std::vector<TensorInfo>& File::tensors() const { return tensors_; }

const TensorInfo* File::find(std::string_view name) const {
  const auto found = index_by_name_.find(name);
  return found == index_by_name_.end() ? nullptr : &tensors_[found->second];
}

const TensorInfo& File::get(std::string_view name) const {
  const TensorInfo* info = find(name);
  if (info == nullptr) throw_bad_input(source_name_ + ": no tensor named " + json_quoted(name));
  return *info;
}

const std::map<std::string, std::string>& File::metadata() const { return metadata_; }

std::span<const std::byte> File::bytes(const TensorInfo& info) const {
  if (header_only_fd_) throw_internal(source_name_ + ": opened with open_header(): read its tensors with read_bytes() or read_f32()");
  const std::size_t data_bytes = file_bytes_.size() - data_start_;
  if (info.begin > info.end || info.end > data_bytes) {
    throw_internal(source_name_ + ": tensor " + json_quoted(info.name) + ": byte range [" +
                   std::to_string(info.begin) + ", " + std::to_string(info.end) +
                   ") is outside the data section of " + std::to_string(data_bytes) +
                   " bytes; the TensorInfo is not from this file");
  }
  return std::span<const std::byte>(file_bytes_)
      .subspan(data_start_ + static_cast<std::size_t>(info.begin),
               static_cast<std::size_t>(info.end - info.begin));
}

std::vector<std::byte> File::read_bytes(const TensorInfo& info) const {
  if (!header_only_fd_) {
    const std::span<const std::byte> held = bytes(info);
    return {held.begin(), held.end()};
  }
  const std::uint64_t data_bytes = header_only_file_bytes_ - data_start_;
  if (info.begin > info.end || info.end > data_bytes) {
    throw_internal(source_name_ + ": tensor " + json_quoted(info.name) + ": byte range [" + std::to_string(info.begin) + ", " +
                   std::to_string(info.end) + ") is outside the data section of " + std::to_string(data_bytes) +
                   " bytes; the TensorInfo is not from this file");
  }
  std::vector<std::byte> out(static_cast<std::size_t>(info.end - info.begin));
  read_exactly(*header_only_fd_, out, data_start_ + info.begin, source_name_, header_only_file_bytes_, " tensor " + json_quoted(info.name));
  return out;
}

std::vector<float> File::read_f32(const TensorInfo& info) const {
  std::vector<std::byte> read;  // holds the bytes of an open_header() File
  if (header_only_fd_) read = read_bytes(info);
  const std::span<const std::byte> raw = header_only_fd_ ? std::span<const std::byte>(read) : bytes(info);
  const std::size_t size = element_size(info.type);
  const auto count = static_cast<std::size_t>(info.elements());
  if (raw.size() != count * size) {
    throw_internal(source_name_ + ": tensor " + json_quoted(info.name) + ": " +
                   std::to_string(raw.size()) + " bytes do not hold shape " +
                   shape_text(info.shape) + "; the TensorInfo is not from this file");
  }
  std::vector<float> values(count);
  switch (info.type) {
    case ElementType::F32:
      for (std::size_t i = 0; i < count; ++i) {
        values[i] = std::bit_cast<float>(load_u32_le(raw.data() + 4 * i));
      }
      break;
    case ElementType::BF16:
      for (std::size_t i = 0; i < count; ++i) {
        values[i] = bf16_bits_to_float(load_u16_le(raw.data() + 2 * i));
      }
      break;
    case ElementType::F16:
      for (std::size_t i = 0; i < count; ++i) {
        values[i] = f16_bits_to_float(load_u16_le(raw.data() + 2 * i));
      }
      break;
    default:
      throw_bad_input(source_name_ + ": tensor " + json_quoted(info.name) + " is " +
                      std::string(element_type_name(info.type)) +
                      "; only F32, BF16 and F16 tensors can be read as fp32");
  }
  return values;
}

const std::string& File::source_name() const { return source_name_; }

StagedFile stage(const std::string& path, const std::vector<TensorToWrite>& tensors,
                 const std::map<std::string, std::string>& metadata) {
  // Validate everything and build the header before touching the file system, so that
  // bad input never creates even the temporary.
  Json header = Json::object();
  std::set<std::string_view> names;
  std::uint64_t offset = 0;
  for (const TensorToWrite& tensor : tensors) {
    if (tensor.name.empty()) throw_bad_input(path + ": cannot write a tensor with an empty name");
    if (tensor.name == kMetadataKey) {
      throw_bad_input(path + ": a tensor cannot be named \"__metadata__\", the metadata's key");
    }
    if (!names.insert(tensor.name).second) fail_tensor_to_write(path, tensor.name, "given twice");
    const auto elements = element_count(tensor.shape);
    if (!elements) {
      fail_tensor_to_write(path, tensor.name,
                           "shape " + shape_text(tensor.shape) +
                               " has a negative dim or more elements than fit in int64");
    }
    const auto needed =
        checked_mul(static_cast<std::uint64_t>(*elements), element_size(tensor.type));
    if (!needed || tensor.data.size() != *needed) {
      fail_tensor_to_write(path, tensor.name,
                           "data is " + std::to_string(tensor.data.size()) + " bytes but shape " +
                               shape_text(tensor.shape) + " of " +
                               std::string(element_type_name(tensor.type)) + " needs " +
                               (needed ? std::to_string(*needed) : std::string("more than 2^64")));
    }
    const std::uint64_t end = offset + *needed;  // cannot wrap: the spans are in memory
    Json entry = Json::object();
    entry["dtype"] = std::string(element_type_name(tensor.type));
    entry["shape"] = tensor.shape;
    entry["data_offsets"] = Json::array({offset, end});
    header[tensor.name] = std::move(entry);
    offset = end;
  }
  if (!metadata.empty()) header[std::string(kMetadataKey)] = metadata;

  std::string header_text;
  try {
    header_text = header.dump();  // nlohmann objects are std::maps: keys come out sorted
  } catch (const Json::exception&) {
    throw_bad_input(path + ": a tensor name or a metadata string is not valid UTF-8");
  }
  // Pad with spaces (valid JSON whitespace) so that the data section starts 8-aligned.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  std::vector<std::byte> prefix_and_header(kLengthPrefixBytes);
  std::uint64_t length = header_text.size();
  for (std::byte& byte : prefix_and_header) {
    byte = static_cast<std::byte>(length & 0xffu);
    length >>= 8;
  }
  const auto* header_begin = reinterpret_cast<const std::byte*>(header_text.data());
  prefix_and_header.insert(prefix_and_header.end(), header_begin,
                           header_begin + header_text.size());

  StagedFile file(path);
  file.write(prefix_and_header);
  for (const TensorToWrite& tensor : tensors) file.write(tensor.data);
  file.finish();
  return file;
}

void write(const std::string& path, const std::vector<TensorToWrite>& tensors,
           const std::map<std::string, std::string>& metadata) {
  stage(path, tensors, metadata).commit();
}

}  // namespace tilemoe::safetensors
