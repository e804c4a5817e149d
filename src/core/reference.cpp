#include "tilemoe/reference.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <mutex>
#include <thread>

#include "expert_math.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/shared_expert.hpp"

namespace tilemoe {

namespace {

// The references index the inputs and weights by the layer's shape: anything of another shape
// would be read past its end, so it is refused first.
void check_step_shapes(const EpWorld& world, const std::vector<Matrix>& inputs, const std::vector<Routing>& routing,
                       const ExpertWeights& weights) {
  const MoeConfig& layer = world.layer;
  const auto ranks = static_cast<std::size_t>(world.world_size());
  if (inputs.size() != ranks || routing.size() != ranks) {
    throw_bad_input("the world has " + std::to_string(ranks) + " ranks but there are " + std::to_string(inputs.size()) +
                    " inputs and " + std::to_string(routing.size()) + " routings");
  }
  check_weights_match(weights, layer);
  for (std::size_t r = 0; r < ranks; ++r) {
    const Matrix& in = inputs[r];
    if (in.rows != world.tokens_per_rank[r] || in.cols != layer.hidden ||
        routing[r].tokens != in.rows || routing[r].top_k != layer.top_k) {
      throw_bad_input("rank " + std::to_string(r) + ": input is " + std::to_string(in.rows) + " x " + std::to_string(in.cols) +
                      " with a routing of " + std::to_string(routing[r].tokens) + " tokens, the layer needs " +
                      std::to_string(world.tokens_per_rank[r]) + " x " + std::to_string(layer.hidden) +
                      ": inputs and layer must agree on the hidden size");
    }
  }
}

// Runs body(first, end, scratch) over [0, rows) in contiguous parts, one thread each. Tokens are
// independent and each writes only its own output rows, so the result does not depend on the
// split. The first exception of any part is rethrown after all have ended.
template <class Body>
void for_token_ranges(std::int64_t rows, Body&& body) {
  const std::int64_t threads = std::clamp<std::int64_t>(std::thread::hardware_concurrency(), 1, 64);
  const std::int64_t per_thread = (rows + threads - 1) / threads;
  std::exception_ptr failure;
  std::mutex failure_mutex;
  {
    // jthreads join as the scope ends, also when starting one more throws
    std::vector<std::jthread> pool;
    for (std::int64_t first = 0; first < rows; first += per_thread) {
      pool.emplace_back([&, first] {
        try {
          body(first, std::min(rows, first + per_thread));
        } catch (...) {
          const std::lock_guard<std::mutex> lock(failure_mutex);
          if (!failure) failure = std::current_exception();
        }
      });
    }
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace

std::vector<Matrix> dense_reference(const EpWorld& world, const std::vector<Matrix>& inputs,
                                    const std::vector<Routing>& routing, const ExpertWeights& weights) {
  check_step_shapes(world, inputs, routing, weights);
  const std::int64_t h = world.layer.hidden, f = world.layer.ffn_hidden, k = world.layer.top_k;
  const DType dtype = world.layer.dtype;
  const bool scales_input = world.layer.router.scales_input;
  std::vector<Matrix> outputs;
  for (int rank = 0; rank < world.world_size(); ++rank) {
    const Matrix& in = inputs.at(static_cast<std::size_t>(rank));
    const Routing& r = routing.at(static_cast<std::size_t>(rank));
    Matrix out(dtype, in.rows, h);
    for_token_ranges(in.rows, [&](std::int64_t first, std::int64_t end) {
      std::vector<float> x(static_cast<std::size_t>(h)), xs(static_cast<std::size_t>(h)), act(static_cast<std::size_t>(f)),
          y(static_cast<std::size_t>(h)), acc(static_cast<std::size_t>(h));
      for (std::int64_t t = first; t < end; ++t) {
        load_row(in.dtype, in.row(t), static_cast<std::size_t>(h), x.data());
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (std::int64_t j = 0; j < k; ++j) {
          const std::size_t s = r.slot(t, j);
          if (!r.kept[s]) continue;
          if (scales_input) {  // the expert's input is x * w in the storage dtype, its output counts once
            for (std::int64_t c = 0; c < h; ++c) xs[static_cast<std::size_t>(c)] = round_to(dtype, x[static_cast<std::size_t>(c)] * r.weight[s]);
          }
          math::gemm0_rows(weights, r.expert[s], scales_input ? xs.data() : x.data(), 1, 0, f, act.data());
          for (float& v : act) v = round_to(dtype, v);  // stored between the GEMMs
          math::gemm1_rows(weights, r.expert[s], act.data(), 1, 0, h, y.data());
          for (float& v : y) v = round_to(dtype, v);    // stored after GEMM1
          math::accumulate_slot(scales_input ? 1.0f : r.weight[s], y.data(), h, acc.data());
        }
        store_row(dtype, acc.data(), static_cast<std::size_t>(h), out.row(t));
      }
    });
    if (weights.shared) add_shared_expert(*weights.shared, in, out);
    outputs.push_back(std::move(out));
  }
  return outputs;
}

std::vector<std::vector<double>> fp64_reference(const EpWorld& world, const std::vector<Matrix>& inputs,
                                                const std::vector<Routing>& routing,
                                                const ExpertWeights& weights) {
  check_step_shapes(world, inputs, routing, weights);
  const std::int64_t h = world.layer.hidden, f = world.layer.ffn_hidden, k = world.layer.top_k;
  const bool scales_input = world.layer.router.scales_input;
  std::vector<std::vector<double>> outputs;
  for (int rank = 0; rank < world.world_size(); ++rank) {
    const Matrix& in = inputs.at(static_cast<std::size_t>(rank));
    const Routing& r = routing.at(static_cast<std::size_t>(rank));
    std::vector<double> out(static_cast<std::size_t>(in.rows * h), 0.0);
    const std::vector<float> x = in.to_floats();
    // One token's output rows: each sum runs over its index in increasing order (the order
    // that defines the reference), with the weights read along their rows (contiguous).
    const auto token_rows = [&](std::int64_t t, std::vector<double>& g, std::vector<double>& u, std::vector<double>& y) {
      for (std::int64_t j = 0; j < k; ++j) {
        const std::size_t s = r.slot(t, j);
        if (!r.kept[s]) continue;
        const double w = r.weight[s];
        math::expert_row_fp64(weights, r.expert[s], x.data() + t * h, scales_input ? w : 1.0, g, u, y);
        for (std::int64_t c = 0; c < h; ++c) out[static_cast<std::size_t>(t * h + c)] += (scales_input ? 1.0 : w) * y[static_cast<std::size_t>(c)];
      }
    };
    for_token_ranges(in.rows, [&](std::int64_t first, std::int64_t end) {
      std::vector<double> g(static_cast<std::size_t>(f)), u(static_cast<std::size_t>(f)), y(static_cast<std::size_t>(h));
      for (std::int64_t t = first; t < end; ++t) token_rows(t, g, u, y);
    });
    if (weights.shared) add_shared_expert_fp64(*weights.shared, in, out);
    outputs.push_back(std::move(out));
  }
  return outputs;
}

namespace {

template <typename Value>
ErrorStats compare_impl(const std::vector<Matrix>& outputs, std::size_t ranks, Value&& reference_value) {
  ErrorStats stats;
  double diff2 = 0.0, ref2 = 0.0;
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::vector<float> a = outputs[r].to_floats();
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double b = reference_value(r, i);
      if (!std::isfinite(a[i])) stats.finite = false;
      const double d = double(a[i]) - b;
      stats.max_abs = std::max(stats.max_abs, std::abs(d));
      diff2 += d * d;
      ref2 += b * b;
    }
  }
  if (!stats.finite) {
    stats.max_abs = INFINITY;
    stats.relative_frobenius = INFINITY;
  } else {
    stats.relative_frobenius = ref2 > 0 ? std::sqrt(diff2 / ref2) : (diff2 > 0 ? INFINITY : 0.0);
  }
  return stats;
}

}  // namespace

ErrorStats compare(const std::vector<Matrix>& outputs, const std::vector<Matrix>& reference) {
  if (outputs.size() != reference.size()) throw_internal("compare: rank counts differ");
  std::vector<std::vector<float>> ref;
  for (const Matrix& m : reference) ref.push_back(m.to_floats());
  return compare_impl(outputs, outputs.size(), [&](std::size_t r, std::size_t i) { return double(ref[r].at(i)); });
}

ErrorStats compare(const std::vector<Matrix>& outputs, const std::vector<std::vector<double>>& reference) {
  if (outputs.size() != reference.size()) throw_internal("compare: rank counts differ");
  return compare_impl(outputs, outputs.size(), [&](std::size_t r, std::size_t i) { return reference[r].at(i); });
}

}  // namespace tilemoe
