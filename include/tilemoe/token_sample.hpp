#pragma once
// A bounded share of a step's tokens for the references. Tokens are independent in an MoE
// layer (each one's output depends on its own row, routing and the weights only), so the
// references computed on a sub-step of some tokens are exactly their rows of the whole step's
// references. Where a reference over every token would take far longer than the step itself
// (the CUDA backend at DeepSeek-V3's shape: minutes of host work for a step of milliseconds),
// the step is checked on such a sample, and the report says how many tokens it was.
#include <cstdint>
#include <vector>

#include "tilemoe/config.hpp"
#include "tilemoe/routing.hpp"
#include "tilemoe/tensor.hpp"

namespace tilemoe {

struct TokenSample {
  std::vector<std::vector<std::int64_t>> tokens;  // per rank, increasing token indices
  std::int64_t sampled = 0;                        // tokens in the sample, over all ranks
  std::int64_t total = 0;                          // tokens of the step
  bool whole() const { return sampled == total; }
};

// The multiply-adds of the references' expert rows for one kept slot of `layer`.
double reference_work_per_row(const MoeConfig& layer);

// Every token when the references' work over the kept rows fits `max_work` multiply-adds;
// otherwise, on every rank that has tokens, about its share of `max_work` in evenly spaced
// tokens (its first and last included, at least one), so that every rank and every part of
// its batch is looked at.
TokenSample sample_tokens(const EpWorld& world, const std::vector<Routing>& routing, double max_work);

// The sub-step of the sampled tokens: a world whose ranks hold only them (the same layer), with
// their input rows and routing. The references run on it unchanged.
struct SampledStep {
  EpWorld world;
  std::vector<Matrix> inputs;
  std::vector<Routing> routing;
};
SampledStep sampled_step(const TokenSample& sample, const EpWorld& world, const std::vector<Matrix>& inputs,
                         const std::vector<Routing>& routing);

// The sampled tokens' rows of per-rank outputs ([tokens, hidden] each), to compare with the
// references of the sub-step.
std::vector<Matrix> sampled_rows(const TokenSample& sample, const std::vector<Matrix>& outputs);

}  // namespace tilemoe
