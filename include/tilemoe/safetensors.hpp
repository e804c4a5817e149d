#pragma once
// safetensors I/O: a strict parser and an atomic writer.
//
// Layout of a safetensors file (https://github.com/huggingface/safetensors):
//   8 bytes   N, the header length, u64 little-endian
//   N bytes   a JSON object, UTF-8: {"name": {"dtype": "F32", "shape": [2, 3],
//             "data_offsets": [begin, end]}, ..., "__metadata__": {"key": "value"}}
//   the rest  the data section; a tensor's bytes are [begin, end) of it, little-endian,
//             row-major
//
// The parser trusts nothing in the file: every malformed input is a tilemoe::Error of
// kind BadInput whose message names the file and, where it applies, the tensor.
// It is stricter than the reference implementation in a few places, each one a file
// that reference writers never produce: duplicate JSON keys (anywhere), keys other than
// dtype/shape/data_offsets in a tensor entry, an empty tensor name, and a shape whose
// non-zero dims multiply past int64 (rejected even when another dim is 0, so that
// strides computed from the shape cannot overflow). It is more lenient in one: tensors
// need not be contiguous, holes between them are tolerated (overlaps are not). Bytes after
// the last tensor are refused, as the reference implementation refuses them.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tilemoe/staged_file.hpp"

namespace tilemoe::safetensors {

enum class ElementType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

// The dtype string of the safetensors spec: "F64", "F32", "F16", "BF16", "I64", ...
std::string_view element_type_name(ElementType type);
// Bytes per element: 8, 4, 2, 2, 8, 4, 2, 1, 1, 1.
std::size_t element_size(ElementType type);

// A tensor name (or any text) from a file, fit for a message on a terminal: JSON-quoted, so
// control characters (escape sequences) are escaped and invalid UTF-8 replaced, and cut to a
// few hundred characters.
std::string printable_name(std::string_view name);
// A shape for a message: "[2, 3]".
std::string shape_text(const std::vector<std::int64_t>& shape);

struct TensorInfo {
  std::string name;
  ElementType type;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets relative to the data section
  // Product of the shape (1 for a scalar, 0 if any dim is 0). Throws an Internal error
  // on a shape that the parser would have rejected (negative dims, overflow).
  std::int64_t elements() const;
};

class File {
 public:
  // Reads and checks the header first (its length against the file's size, every tensor's
  // range, nothing after the last tensor), then the data section; errors name the path.
  static File open(const std::string& path);
  // Reads and checks the header only, as open() does; a tensor's bytes are read from the file
  // when read_f32() or read_bytes() asks for them, so that a model's shard of many GB is never
  // read whole for the one layer wanted. bytes() is not available on such a File.
  static File open_header(const std::string& path);
  // Parses bytes already in memory; source_name stands for them in error messages.
  static File parse(std::vector<std::byte> bytes, std::string source_name);

  // All tensors, in data-offset order (ties, which only zero-size tensors can have,
  // broken by name).
  const std::vector<TensorInfo>& tensors() const;
  const TensorInfo* find(std::string_view name) const;  // nullptr if absent
  // Bad-input error naming the tensor and the file if absent.
  const TensorInfo& get(std::string_view name) const;
  // The "__metadata__" entry, empty when the file has none.
  const std::map<std::string, std::string>& metadata() const;

  // The tensor's raw little-endian bytes; a view into this File, valid while it lives.
  // `info` must come from this File (an Internal error if its range is out of bounds, or if
  // the File was opened with open_header()).
  std::span<const std::byte> bytes(const TensorInfo& info) const;
  // The same bytes, copied: from memory, or read from the file for open_header()'s File (a
  // file that shrank since it was opened is a bad-input error naming it).
  std::vector<std::byte> read_bytes(const TensorInfo& info) const;
  // The tensor's values as fp32: F32, BF16 and F16 convert exactly (every bf16 and fp16
  // value is an fp32 value); any other element type is a bad-input error.
  std::vector<float> read_f32(const TensorInfo& info) const;

  const std::string& source_name() const;

 private:
  File() = default;

  std::string source_name_;
  std::vector<std::byte> file_bytes_;
  std::size_t data_start_ = 0;  // 8 + header length
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> index_by_name_;  // into tensors_
  std::map<std::string, std::string> metadata_;
  std::shared_ptr<const int> header_only_fd_;  // open_header(): the descriptor the data is read through
  std::uint64_t header_only_file_bytes_ = 0;
};

struct TensorToWrite {
  std::string name;
  ElementType type;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> data;  // the raw little-endian bytes, row-major
};

// Writes a safetensors file atomically: everything goes to a temporary next to `path`
// (StagedFile), which is flushed to disk and then renamed onto `path`. On any failure the
// temporary is removed and `path` is left as it was (absent, or the old file untouched); a
// `path` that exists but is not a regular file (a device node) is refused, never replaced.
// The header's JSON keys are sorted, the header is padded with spaces to a multiple of
// 8 bytes as the reference implementation does (so the data section starts 8-aligned),
// and the data follows in the given order, without holes.
// Bad input: a data size other than elements * element_size, a negative dim, an empty
// name, a name given twice or named "__metadata__", a name or metadata string that is
// not valid UTF-8, and any I/O failure (each message names the path).
void write(const std::string& path, const std::vector<TensorToWrite>& tensors,
           const std::map<std::string, std::string>& metadata = {});
// The same file, written and flushed under its temporary name but not yet renamed onto `path`:
// for a caller that commits it together with other files, once all of them are written.
StagedFile stage(const std::string& path, const std::vector<TensorToWrite>& tensors,
                 const std::map<std::string, std::string>& metadata = {});

}  // namespace tilemoe::safetensors
