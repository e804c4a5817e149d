#include "moe_cases.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include "tilemoe/dtype.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cases {

const std::vector<ModelShape>& model_shapes() {
  static const std::vector<ModelShape> shapes = {
      {"mixtral-8x7b", 4096, 14336, 8, 2},
      {"qwen3-30b-a3b", 2048, 768, 128, 8},
      {"deepseek-v3", 7168, 2048, 256, 8},
  };
  return shapes;
}

std::string MoeCase::id() const {
  std::string text = name;
  text += ':';
  text += std::to_string(tokens);
  if (ranks > 1) {
    text += ':';
    text += std::to_string(ranks);
  }
  return text;
}

bool MoeCase::small() const {
  return ranks <= 4 && tokens * hidden * ffn <= (ranks > 1 ? 40'000'000 : 8'000'000);
}

MoeConfig MoeCase::config() const {
  MoeConfig config;
  config.tokens = tokens;
  config.hidden = hidden;
  config.ffn_hidden = ffn;
  config.num_experts = experts;
  config.top_k = top_k;
  config.activation = activation;
  config.renormalize = renormalize;
  config.dtype = DType::BF16;
  return config;
}

EpWorld MoeCase::world(Mode mode) const {
  EpWorld world;
  world.layer = config();
  world.layer.tokens = 0;
  for (int r = 0; r < ranks; ++r) world.tokens_per_rank.push_back(mode == kTest ? std::max<std::int64_t>(tokens - 3 * r, 0) : tokens);
  if (zero_token_rank) world.tokens_per_rank.back() = 0;
  return world;
}

namespace {

std::vector<MoeCase> build_registry() {
  std::vector<MoeCase> cases;
  const auto add = [&](std::string name, int ranks, std::int64_t tokens, std::int64_t hidden, std::int64_t ffn,
                       std::int64_t experts, std::int64_t top_k) -> MoeCase& {
    MoeCase c;
    c.name = std::move(name);
    c.ranks = ranks;
    c.tokens = tokens;
    c.hidden = hidden;
    c.ffn = ffn;
    c.experts = experts;
    c.top_k = top_k;
    return cases.emplace_back(std::move(c));
  };
  // the one-GPU layer's tests: edge shapes first, then the models' proportions scaled down
  const auto one_gpu = [&](std::string name, std::int64_t tokens, std::int64_t hidden, std::int64_t ffn, std::int64_t experts,
                           std::int64_t top_k) -> MoeCase& { return add(std::move(name), 1, tokens, hidden, ffn, experts, top_k); };
  one_gpu("small", 300, 512, 768, 16, 4);
  one_gpu("mixtral-like", 256, 1024, 1792, 8, 2);
  {
    MoeCase& c = one_gpu("deepseek-like", 128, 896, 256, 64, 8);
    c.renormalize = true;
    c.pattern = RoutingPattern::Skewed;
  }
  one_gpu("zero-tokens", 0, 256, 256, 8, 2);
  one_gpu("all-to-one-expert", 129, 256, 512, 8, 1).pattern = RoutingPattern::OneExpert;
  one_gpu("top-k-equals-experts", 33, 128, 128, 4, 4);
  one_gpu("hidden-8-odd-tokens", 7, 8, 8, 4, 2);
  one_gpu("gelu", 77, 256, 384, 8, 2).activation = Activation::GELU;
  one_gpu("1024-experts", 64, 128, 128, 1024, 8);

  // the expert-parallel layer's tests
  const auto& ep = add;
  ep("two-ranks", 2, 200, 256, 512, 8, 2);
  {
    MoeCase& c = ep("skewed", 4, 300, 512, 768, 16, 4);
    c.pattern = RoutingPattern::Skewed;
    c.renormalize = true;
  }
  ep("top-8-over-2-local-experts", 8, 128, 256, 256, 16, 8);
  {
    MoeCase& c = ep("deepseek-like", 8, 96, 896, 256, 64, 8);
    c.pattern = RoutingPattern::Skewed;
    c.renormalize = true;
  }
  {
    MoeCase& c = ep("all-to-one-expert-a-rank-without-tokens", 4, 129, 256, 512, 8, 1);
    c.pattern = RoutingPattern::OneExpert;
    c.zero_token_rank = true;
  }
  ep("mixtral-like", 4, 256, 1024, 1792, 8, 2);
  ep("hidden-8", 2, 7, 8, 8, 4, 2);
  ep("top-k-equals-experts", 4, 33, 128, 128, 8, 8);  // every token on every rank, twice
  ep("1024-experts", 4, 64, 128, 128, 1024, 8);       // 256 local experts, most of them without rows
  // every rank's GEMMs and consumer on one GPU at once, at a size that fills it (the oracle
  // checks a token sample there)
  ep("filling-the-gpu", 8, 2048, 2048, 1024, 16, 2);
  // last: a driver without usable green contexts would fail these, and nothing else
  ep("sm-partitions", 4, 256, 512, 1024, 16, 4).sms_per_rank = 24;
  {
    MoeCase& c = ep("sm-partitions", 8, 128, 256, 512, 16, 2);
    c.pattern = RoutingPattern::Skewed;
    c.sms_per_rank = 16;
  }

  // the benchmarks: the models at the token counts of a training step's micro-batch per GPU
  for (const ModelShape& shape : model_shapes()) {
    for (const std::int64_t tokens : {512, 4096, 16384}) {
      MoeCase& c = one_gpu(shape.name, tokens, shape.hidden, shape.ffn, shape.experts, shape.top_k);
      c.modes = kPerf;
      c.quick = tokens == 4096;
    }
  }
  // the overlap on virtual ranks: the two shapes whose combine is large (Qwen3's is not)
  for (const char* model : {"mixtral-8x7b", "deepseek-v3"}) {
    const ModelShape& shape = *std::find_if(model_shapes().begin(), model_shapes().end(),
                                            [&](const ModelShape& s) { return std::string_view(s.name) == model; });
    for (const std::int64_t tokens : {4096, 16384}) {
      for (const int ranks : {4, 8}) {
        MoeCase& c = ep(shape.name, ranks, tokens, shape.hidden, shape.ffn, shape.experts, shape.top_k);
        c.modes = kPerf;
        c.quick = tokens == 4096 && ranks == 4;
      }
    }
  }
  return cases;
}

}  // namespace

const std::vector<MoeCase>& registry() {
  static const std::vector<MoeCase> cases = build_registry();
  return cases;
}

std::uint64_t registry_place(const MoeCase& c) {
  const auto it = std::find_if(registry().begin(), registry().end(), [&](const MoeCase& r) { return r.id() == c.id(); });
  if (it == registry().end()) throw_internal("case " + c.id() + " is not in the registry");
  return static_cast<std::uint64_t>(it - registry().begin());
}

std::vector<MoeCase> select_cases(bool expert_parallel, Mode mode, const std::vector<std::string>& ids) {
  std::vector<MoeCase> chosen;
  if (ids.empty()) {
    for (const MoeCase& c : registry()) {
      if (c.expert_parallel() == expert_parallel && (c.modes & mode) != 0) chosen.push_back(c);
    }
    return chosen;
  }
  for (const std::string& id : ids) {
    const auto it = std::find_if(registry().begin(), registry().end(),
                                 [&](const MoeCase& c) { return c.expert_parallel() == expert_parallel && c.id() == id; });
    if (it == registry().end()) {
      std::string known;
      for (const MoeCase& c : registry()) {
        if (c.expert_parallel() == expert_parallel) known += (known.empty() ? "" : ", ") + c.id();
      }
      throw_bad_input("no " + std::string(expert_parallel ? "expert-parallel" : "one-GPU") + " case '" + id + "'; the cases are: " +
                      known);
    }
    chosen.push_back(*it);
  }
  return chosen;
}

std::shared_ptr<const SharedExpert> random_shared_expert(const MoeConfig& layer, std::int64_t ffn, bool gated, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto draw = [&](std::int64_t count, std::int64_t fan_in) {
    std::vector<float> values(static_cast<std::size_t>(count));
    const float scale = std::sqrt(3.0f / static_cast<float>(fan_in));
    for (float& v : values) v = dist(rng) * scale;
    return values;
  };
  const std::vector<float> w1 = draw(ffn * layer.hidden, layer.hidden), w3 = draw(ffn * layer.hidden, layer.hidden),
                           w2 = draw(layer.hidden * ffn, ffn);
  // x . gate has about unit variance on unit inputs: sigmoid spreads over about (0.1, 0.9)
  const std::vector<float> gate = gated ? draw(layer.hidden, layer.hidden) : std::vector<float>{};
  return std::make_shared<const SharedExpert>(make_shared_expert(layer, ffn, w1, w3, w2, gate));
}

ExpertWeights biased_weights(const MoeConfig& layer, std::uint64_t seed) {
  ExpertWeights w = random_weights(layer, seed);
  for (std::vector<float>* m : {&w.w1t, &w.w3t}) {
    for (float& v : *m) v = round_to(layer.dtype, 4.0f * v);
  }
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<float> dist(-0.5f, 0.5f);
  auto draw = [&](std::int64_t count) {
    std::vector<float> values(static_cast<std::size_t>(count));
    for (float& v : values) v = round_to(layer.dtype, dist(rng));
    return values;
  };
  w.b1 = draw(layer.num_experts * layer.ffn_hidden);
  w.b3 = draw(layer.num_experts * layer.ffn_hidden);
  w.b2 = draw(layer.num_experts * layer.hidden);
  return w;
}

}  // namespace tilemoe::cases
