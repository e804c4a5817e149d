#pragma once
// References a step is checked against.
//  - dense_reference: one rank, no communication, token by token, with the same fp32
//    arithmetic and rounding points as every executor: the bitwise oracle.
//  - fp64_reference: the same maths in double precision without intermediate rounding:
//    the accuracy yardstick (relative Frobenius error).
#include <vector>

#include "tilemoe/config.hpp"
#include "tilemoe/routing.hpp"
#include "tilemoe/tensor.hpp"
#include "tilemoe/weights.hpp"

namespace tilemoe {

// inputs[r] is rank r's [tokens, hidden]; returns each rank's [tokens, hidden] output.
std::vector<Matrix> dense_reference(const EpWorld& world, const std::vector<Matrix>& inputs,
                                    const std::vector<Routing>& routing, const ExpertWeights& weights);

// Same, in fp64; returned as fp64 values per rank, row-major.
std::vector<std::vector<double>> fp64_reference(const EpWorld& world, const std::vector<Matrix>& inputs,
                                                const std::vector<Routing>& routing,
                                                const ExpertWeights& weights);

struct ErrorStats {
  double max_abs = 0.0;            // max |a - b|
  double relative_frobenius = 0.0; // ||a - b||_F / ||b||_F (0 when both are 0)
  bool finite = true;              // no NaN or Inf in a
};
ErrorStats compare(const std::vector<Matrix>& outputs, const std::vector<Matrix>& reference);
ErrorStats compare(const std::vector<Matrix>& outputs, const std::vector<std::vector<double>>& reference);

}  // namespace tilemoe
