#include "tilemoe/token_sample.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tilemoe/error.hpp"

namespace tilemoe {

double reference_work_per_row(const MoeConfig& layer) {
  return static_cast<double>(layer.hidden) * static_cast<double>(layer.ffn_hidden) *
         (layer.activation == Activation::SwiGLU ? 3.0 : 2.0);
}

TokenSample sample_tokens(const EpWorld& world, const std::vector<Routing>& routing, double max_work) {
  const auto ranks = static_cast<std::size_t>(world.world_size());
  if (routing.size() != ranks) throw_internal("sample_tokens: a routing per rank is needed");
  TokenSample sample;
  sample.tokens.resize(ranks);
  std::int64_t kept_rows = 0;
  for (const Routing& r : routing) {
    for (const std::uint8_t kept : r.kept) kept_rows += kept;
  }
  sample.total = world.total_tokens();
  const double work = static_cast<double>(kept_rows) * reference_work_per_row(world.layer);
  // the share of every rank's tokens the budget affords (1: all of them)
  const double share = work <= max_work ? 1.0 : std::max(0.0, max_work / work);
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::int64_t tokens = world.tokens_per_rank[r];
    if (tokens <= 0) continue;
    std::vector<std::int64_t>& chosen = sample.tokens[r];
    const auto count = std::clamp<std::int64_t>(static_cast<std::int64_t>(std::floor(static_cast<double>(tokens) * share)), 1, tokens);
    chosen.reserve(static_cast<std::size_t>(count));
    if (count == 1) {
      chosen.push_back(0);
    } else {
      // i * (tokens - 1) / (count - 1), rounded down: steps of at least one token while count <=
      // tokens (the product is exact in a double below 2^53, the quotient correctly rounded)
      for (std::int64_t i = 0; i < count; ++i) {
        chosen.push_back(static_cast<std::int64_t>(static_cast<double>(i) * static_cast<double>(tokens - 1) / static_cast<double>(count - 1)));
      }
    }
    sample.sampled += count;
  }
  return sample;
}

namespace {

Matrix select_rows(const Matrix& m, const std::vector<std::int64_t>& rows) {
  Matrix out(m.dtype, static_cast<std::int64_t>(rows.size()), m.cols);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= m.rows) throw_internal("a sampled token lies outside its rank's rows");
    if (m.row_bytes() > 0) std::memcpy(out.row(static_cast<std::int64_t>(i)), m.row(rows[i]), m.row_bytes());
  }
  return out;
}

}  // namespace

SampledStep sampled_step(const TokenSample& sample, const EpWorld& world, const std::vector<Matrix>& inputs,
                         const std::vector<Routing>& routing) {
  const auto ranks = static_cast<std::size_t>(world.world_size());
  if (sample.tokens.size() != ranks || inputs.size() != ranks || routing.size() != ranks) {
    throw_internal("sampled_step: the sample, the inputs and the routing must have a rank each");
  }
  SampledStep step;
  step.world = world;
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::vector<std::int64_t>& tokens = sample.tokens[r];
    step.world.tokens_per_rank[r] = static_cast<std::int64_t>(tokens.size());
    step.inputs.push_back(select_rows(inputs[r], tokens));
    const Routing& from = routing[r];
    Routing to;
    to.tokens = static_cast<std::int64_t>(tokens.size());
    to.top_k = from.top_k;
    for (const std::int64_t t : tokens) {
      for (std::int64_t j = 0; j < from.top_k; ++j) {
        const std::size_t s = from.slot(t, j);
        to.expert.push_back(from.expert.at(s));
        to.weight.push_back(from.weight.at(s));
        to.kept.push_back(from.kept.at(s));
      }
    }
    step.routing.push_back(std::move(to));
  }
  return step;
}

std::vector<Matrix> sampled_rows(const TokenSample& sample, const std::vector<Matrix>& outputs) {
  if (sample.tokens.size() != outputs.size()) throw_internal("sampled_rows: the sample and the outputs must have a rank each");
  std::vector<Matrix> rows;
  for (std::size_t r = 0; r < outputs.size(); ++r) rows.push_back(select_rows(outputs[r], sample.tokens[r]));
  return rows;
}

}  // namespace tilemoe
