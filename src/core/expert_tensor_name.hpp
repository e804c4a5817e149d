#pragma once
// The Hugging Face name of one expert matrix: Mixtral's "<prefix>experts.<e>.<w1|w2|w3>.weight",
// or Qwen-MoE's and DeepSeek's "<prefix>experts.<e>.<gate_proj|down_proj|up_proj>.weight" (the
// same matrices: gate, down, up). Taken apart without a regex: std::regex matches recursively in
// the name's length, so a name of some tens of thousands of characters from a file overflowed
// the stack.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tilemoe/config.hpp"

namespace tilemoe {

struct ExpertTensorName {
  std::string prefix;  // everything before "experts.", e.g. "model.layers.0.block_sparse_moe."
  std::int64_t expert = 0;
  std::string part;    // "w1", "w2" or "w3" (gate_proj, down_proj and up_proj read as these)
  std::string spelling;  // the part as the name spells it
};

// nullopt for a name that is not an expert matrix (another tensor of the file, ignored).
// A bad-input error for one that is, but whose index is not the canonical decimal of a valid
// expert (a leading zero, or more than kMaxExpertIndexDigits digits): "experts.01" would
// otherwise alias expert 1 and silently replace its weight.
std::optional<ExpertTensorName> parse_expert_tensor_name(std::string_view name);

}  // namespace tilemoe
