#include "tilemoe/dtype.hpp"

#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe {

std::string_view dtype_name(DType dtype) { return dtype == DType::F32 ? "fp32" : "bf16"; }

DType parse_dtype(std::string_view name) {
  if (name == "fp32" || name == "f32" || name == "float32") return DType::F32;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  throw_bad_input("unknown storage dtype '" + std::string(name) + "': use fp32 or bf16");
}

void load_row(DType dtype, const std::byte* src, std::size_t count, float* dst) {
  // An empty tensor's data() may be null, and memcpy with a null pointer is undefined even
  // for 0 bytes.
  if (count == 0) return;
  if (dtype == DType::F32) {
    std::memcpy(dst, src, count * sizeof(float));
    return;
  }
  for (std::size_t i = 0; i < count; ++i) {
    std::uint16_t bits;
    std::memcpy(&bits, src + 2 * i, 2);
    dst[i] = bf16_bits_to_float(bits);
  }
}

void store_row(DType dtype, const float* src, std::size_t count, std::byte* dst) {
  if (count == 0) return;  // see load_row
  if (dtype == DType::F32) {
    std::memcpy(dst, src, count * sizeof(float));
    return;
  }
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint16_t bits = float_to_bf16_bits(src[i]);
    std::memcpy(dst + 2 * i, &bits, 2);
  }
}

}  // namespace tilemoe
