#include "tilemoe/tensor.hpp"

#include <cstring>

#include "tilemoe/error.hpp"

namespace tilemoe {

float Matrix::at(std::int64_t r, std::int64_t c) const {
  float value;
  load_row(dtype, row(r) + static_cast<std::size_t>(c) * dtype_size(dtype), 1, &value);
  return value;
}

Matrix Matrix::from_floats(DType type, std::int64_t rows, std::int64_t cols, std::span<const float> values) {
  if (static_cast<std::int64_t>(values.size()) != rows * cols) {
    throw_internal("matrix of " + std::to_string(rows) + " x " + std::to_string(cols) + " from " +
                   std::to_string(values.size()) + " values");
  }
  Matrix m(type, rows, cols);
  store_row(type, values.data(), values.size(), m.data.data());
  return m;
}

std::vector<float> Matrix::to_floats() const {
  std::vector<float> values(static_cast<std::size_t>(rows * cols));
  load_row(dtype, data.data(), values.size(), values.data());
  return values;
}

bool Matrix::bitwise_equal(const Matrix& other) const {
  return dtype == other.dtype && rows == other.rows && cols == other.cols &&
         (data.empty() || std::memcmp(data.data(), other.data.data(), data.size()) == 0);
}

}  // namespace tilemoe
