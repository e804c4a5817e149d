#include "expert_tensor_name.hpp"

#include <array>

#include "tilemoe/error.hpp"
#include "tilemoe/safetensors.hpp"

namespace tilemoe {

namespace {

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// An index for a message: digits only, but possibly thousands of them.
std::string shortened(std::string_view digits) {
  constexpr std::size_t kShown = 24;
  return digits.size() <= kShown ? std::string(digits)
                                 : std::string(digits.substr(0, kShown)) + "... (" + std::to_string(digits.size()) + " digits)";
}

}  // namespace

std::optional<ExpertTensorName> parse_expert_tensor_name(std::string_view name) {
  static constexpr std::string_view kExperts = "experts.";
  // each spelling and the part it is: Mixtral's, then Qwen-MoE's and DeepSeek's
  static constexpr std::array<std::array<std::string_view, 2>, 6> kParts = {{
      {"w1", "w1"}, {"w2", "w2"}, {"w3", "w3"}, {"gate_proj", "w1"}, {"down_proj", "w2"}, {"up_proj", "w3"}}};
  // "<prefix>experts.<digits>.<part>.weight", read from the end: every step is a fixed suffix
  // or the run of digits before it, so the whole match is one pass, whatever the length.
  std::string_view rest = name;
  static constexpr std::string_view kWeight = ".weight";
  if (!ends_with(rest, kWeight)) return std::nullopt;
  rest.remove_suffix(kWeight.size());
  std::string_view part, spelling;
  for (const auto& [candidate, meaning] : kParts) {
    if (ends_with(rest, candidate) && rest.size() > candidate.size() && rest[rest.size() - candidate.size() - 1] == '.') {
      spelling = candidate;
      part = meaning;
    }
  }
  if (part.empty()) return std::nullopt;
  rest.remove_suffix(spelling.size() + 1);
  std::size_t digits = 0;
  while (digits < rest.size() && is_digit(rest[rest.size() - 1 - digits])) ++digits;
  if (digits == 0) return std::nullopt;
  const std::string_view index = rest.substr(rest.size() - digits);
  rest.remove_suffix(digits);
  if (!ends_with(rest, kExperts)) return std::nullopt;
  rest.remove_suffix(kExperts.size());

  // The index is the only way to tell experts apart: one expert must have one spelling.
  const std::string what = "tensor " + safetensors::printable_name(name) + ": expert index ";
  if (index.size() > 1 && index.front() == '0') {
    std::size_t zeros = 0;
    while (zeros + 1 < index.size() && index[zeros] == '0') ++zeros;
    throw_bad_input(what + shortened(index) + " has a leading zero; write it as " +
                    shortened(index.substr(zeros)) + " (the Hugging Face names have none), so that no two names can mean one expert");
  }
  std::int64_t expert = 0;
  for (char c : index) {
    expert = expert * 10 + (c - '0');
    if (expert >= kMaxExperts) {
      throw_bad_input(what + shortened(index) + " is not below " + std::to_string(kMaxExperts) +
                      ", the most experts a layer may have");
    }
  }
  return ExpertTensorName{std::string(rest), expert, std::string(part), std::string(spelling)};
}

}  // namespace tilemoe
