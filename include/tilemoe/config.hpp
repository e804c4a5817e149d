#pragma once
// What one MoE layer step is: the layer's shape and the expert-parallel world it runs in.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tilemoe/dtype.hpp"

namespace tilemoe {

enum class Activation : std::uint8_t {
  SwiGLU,  // silu(x w1^T) * (x w3^T), then w2: the Mixtral / Qwen / DeepSeek expert
  GELU,    // gelu(x w1^T), then w2 (erf form); w3 is not used
};
std::string_view activation_name(Activation activation);
Activation parse_activation(std::string_view name);

// How the router turns a token's logits into expert scores (transformers' model code is the
// reference; NOTES.md names the functions matched): softmax over all experts (Mixtral, Qwen),
// sigmoid (DeepSeek-V3), sqrt(softplus) (DeepSeek-V4), or the logits themselves (GPT-OSS, whose
// weights are then a softmax over the k selected logits: RouterWeights::SoftmaxOfSelected).
enum class ScoreFunction : std::uint8_t { Softmax, Sigmoid, SqrtSoftplus, Logits };
std::string_view score_function_name(ScoreFunction function);
ScoreFunction parse_score_function(std::string_view name);  // "softmax", "sigmoid", "sqrt-softplus", "logits"

// The chosen experts' weights: their scores (unbiased), or a softmax over their scores taken in
// slot order (GPT-OSS: softmax after top-k).
enum class RouterWeights : std::uint8_t { Scores, SoftmaxOfSelected };
std::string_view router_weights_name(RouterWeights weights);
RouterWeights parse_router_weights(std::string_view name);  // "scores", "softmax-of-selected"

// The routing rule of a layer beyond top-k (routing.hpp gives the order of every step). The
// defaults are Mixtral's: softmax scores, top-k over all experts, the scores as weights.
struct RouterConfig {
  ScoreFunction score = ScoreFunction::Softmax;
  // Group-limited selection (DeepSeek-V3's n_group / topk_group): the experts split into
  // `groups` equal groups of consecutive ids; a group's score is the sum of its two best
  // selection scores; only the experts of the best `top_groups` groups may be chosen (the others'
  // selection scores count as -inf, as transformers 5.x masks them). 1 / 1: no groups.
  std::int64_t groups = 1;
  std::int64_t top_groups = 1;
  RouterWeights weights = RouterWeights::Scores;
  // With MoeConfig::renormalize, the weights are divided by their sum plus this (DeepSeek: 1e-20).
  float renormalize_epsilon = 0.0f;
  // Every weight is multiplied by this last (DeepSeek's routed_scaling_factor: 2.5 in V3).
  float scaling = 1.0f;
  // Llama-4: a slot's weight scales the expert's input, x * w rounded to the storage dtype, and
  // the expert's output enters the token's sum as it is (weight 1). Otherwise it scales the output.
  bool scales_input = false;

  bool is_default() const {
    return score == ScoreFunction::Softmax && groups == 1 && top_groups == 1 && weights == RouterWeights::Scores &&
           renormalize_epsilon == 0.0f && scaling == 1.0f && !scales_input;
  }
};

// SwiGLU as GPT-OSS (and DeepSeek-V4) compute it: the gate clamped above at `limit`, the up
// projection clamped to [-limit, limit], glu = gate * sigmoid(alpha * gate), then
// (up + up_offset) * glu. The default (limit 0: no clamp, alpha 1, offset 0) is plain SwiGLU,
// computed as silu(gate) * up exactly as before.
struct SwigluVariant {
  float limit = 0.0f;  // 0: no clamp
  float alpha = 1.0f;
  float up_offset = 0.0f;
  bool is_default() const { return limit == 0.0f && alpha == 1.0f && up_offset == 0.0f; }
  bool operator==(const SwigluVariant&) const = default;
};

// The most experts a layer may have: far above any published model, low enough that a count
// past it is a typo (and that an expert index from a file fits in 7 decimal digits).
constexpr std::int64_t kMaxExperts = std::int64_t{1} << 20;

// The largest capacity factor accepted: far above num_experts / top_k of any real layer (past
// which nothing is dropped), so a larger one is a typo.
constexpr double kMaxCapacityFactor = 1e6;

struct MoeConfig {
  std::int64_t tokens = 0;        // tokens on this rank (0 is valid)
  std::int64_t hidden = 0;        // model width, multiple of 8
  std::int64_t ffn_hidden = 0;    // expert inner width, multiple of 8
  std::int64_t num_experts = 0;   // E
  std::int64_t top_k = 0;         // experts per token, 1..E
  Activation activation = Activation::SwiGLU;
  SwigluVariant swiglu;           // GPT-OSS's clamped SwiGLU; plain by default
  bool renormalize = false;       // divide the k selected weights by their sum
  RouterConfig router;            // the scores, groups and weights (Mixtral's by default)
  // 0 = dropless. Otherwise each rank keeps, for each expert, at most
  // ceil(capacity_factor * tokens * top_k / num_experts) of its own token slots; see routing.hpp.
  double capacity_factor = 0.0;
  DType dtype = DType::BF16;      // storage of activations and weights; accumulation is fp32
};

// Expert parallelism: rank r of W owns experts [r*E/W, (r+1)*E/W).
struct ParallelConfig {
  int world_size = 1;
  int rank = 0;
};

std::int64_t local_expert_count(const MoeConfig& config, const ParallelConfig& parallel);
std::int64_t first_local_expert(const MoeConfig& config, const ParallelConfig& parallel);
int owner_of_expert(const MoeConfig& config, int world_size, std::int64_t expert);

// Bad-input errors that say what to change.
void validate(const MoeConfig& config);
void validate(const MoeConfig& config, const ParallelConfig& parallel);

// A whole expert-parallel step as one process sees it when it plays every rank (the CPU
// engine, the tests): one layer shape and the token count of each rank, which may differ.
struct EpWorld {
  MoeConfig layer;                          // layer.tokens is unused: see tokens_per_rank
  std::vector<std::int64_t> tokens_per_rank;
  int world_size() const { return static_cast<int>(tokens_per_rank.size()); }
  MoeConfig rank_config(int rank) const;    // layer with tokens = tokens_per_rank[rank]
  std::int64_t total_tokens() const;
  std::int64_t experts_per_rank() const { return layer.num_experts / world_size(); }
};
void validate(const EpWorld& world);

// Splits `total` tokens over `world_size` ranks as evenly as possible, the first ranks
// taking the remainder.
std::vector<std::int64_t> split_tokens_evenly(std::int64_t total, int world_size);

}  // namespace tilemoe
