#pragma once
// A row-major matrix in a storage dtype: the form of a rank's inputs and outputs.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tilemoe/dtype.hpp"

namespace tilemoe {

struct Matrix {
  DType dtype = DType::BF16;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::vector<std::byte> data;

  Matrix() = default;
  Matrix(DType type, std::int64_t r, std::int64_t c)
      : dtype(type), rows(r), cols(c), data(static_cast<std::size_t>(r * c) * dtype_size(type)) {}

  std::size_t row_bytes() const { return static_cast<std::size_t>(cols) * dtype_size(dtype); }
  std::byte* row(std::int64_t r) { return data.data() + static_cast<std::size_t>(r) * row_bytes(); }
  const std::byte* row(std::int64_t r) const { return data.data() + static_cast<std::size_t>(r) * row_bytes(); }
  float at(std::int64_t r, std::int64_t c) const;

  static Matrix from_floats(DType type, std::int64_t rows, std::int64_t cols, std::span<const float> values);
  std::vector<float> to_floats() const;
  bool bitwise_equal(const Matrix& other) const;
};

}  // namespace tilemoe
