#pragma once
// Storage types. Values are stored as fp32 or bf16; arithmetic is always fp32.
// bf16 rounding is round-to-nearest-even, the rule of every GPU converter, so the CPU
// oracle and the CUDA kernels round a value the same way.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tilemoe {

enum class DType : std::uint8_t { F32, BF16 };

constexpr std::size_t dtype_size(DType dtype) { return dtype == DType::F32 ? 4 : 2; }
std::string_view dtype_name(DType dtype);    // "fp32" / "bf16"
DType parse_dtype(std::string_view name);    // accepts fp32|f32|float32|bf16|bfloat16; else bad input

inline std::uint16_t float_to_bf16_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);  // keep NaN a (quiet) NaN
  }
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

inline float bf16_bits_to_float(std::uint16_t half) {
  const std::uint32_t bits = static_cast<std::uint32_t>(half) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// The value a float takes once stored in `dtype`.
inline float round_to(DType dtype, float value) {
  return dtype == DType::F32 ? value : bf16_bits_to_float(float_to_bf16_bits(value));
}

// Row codecs: storage bytes <-> fp32 working values.
void load_row(DType dtype, const std::byte* src, std::size_t count, float* dst);
void store_row(DType dtype, const float* src, std::size_t count, std::byte* dst);

}  // namespace tilemoe
