// libFuzzer target: the safetensors parser on arbitrary bytes. The contract under test is
// that malformed input is a tilemoe::Error of kind BadInput and nothing else: any other
// exception, a crash or a sanitizer report (ASan, UBSan) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "tilemoe/error.hpp"
#include "tilemoe/safetensors.hpp"

namespace {

namespace st = tilemoe::safetensors;

// Uses everything a caller would use on a parsed file, so that an inconsistent File (a
// range out of bounds, a size that does not match its shape) shows up as a sanitizer
// report rather than going unnoticed.
void exercise(const st::File& file) {
  volatile std::uint8_t checksum = 0;
  for (const st::TensorInfo& info : file.tensors()) {
    if (file.find(info.name) != &info) std::abort();  // the index must agree with the list
    const auto bytes = file.bytes(info);
    if (bytes.size() != static_cast<std::size_t>(info.elements()) * st::element_size(info.type)) {
      std::abort();
    }
    for (const std::byte byte : bytes) checksum = checksum ^ std::to_integer<std::uint8_t>(byte);
    if (info.type == st::ElementType::F32 || info.type == st::ElementType::BF16 ||
        info.type == st::ElementType::F16) {
      const std::vector<float> values = file.read_f32(info);
      if (values.size() != static_cast<std::size_t>(info.elements())) std::abort();
    }
  }
  for (const auto& [key, value] : file.metadata()) {
    checksum = checksum ^ static_cast<std::uint8_t>(key.size() + value.size());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> bytes(size);
  if (size != 0) std::memcpy(bytes.data(), data, size);
  try {
    exercise(st::File::parse(std::move(bytes), "fuzz-input"));
  } catch (const tilemoe::Error& error) {
    // BadInput is the documented answer to malformed bytes; Internal would be a bug.
    if (error.kind() != tilemoe::ErrorKind::BadInput) std::abort();
  }
  return 0;
}
