#pragma once
// The tensors of one MoE layer wherever they are stored - one weights file, or the shards of a
// model directory - and how they become the layer's weights: found by name, every shape checked
// against the layer, values read only when wanted (the files are opened header first) and
// refused when not finite in the layer's dtype.
//
// Expert layouts read: one matrix per expert and part ("<prefix>experts.<e>.w1.weight" or
// "...gate_proj.weight", expert_tensor_name.hpp), or transformers 5's fused pair
// "<prefix>experts.gate_up_proj" [E, 2 ffn, hidden] (gate rows first, then up) and
// "<prefix>experts.down_proj" [E, hidden, ffn], as save_pretrained writes them with
// save_original_format=False; or GPT-OSS's: "<prefix>experts.gate_up_proj" [E, hidden, 2 ffn]
// (x times it; gate at the even columns, up at the odd ones) with "..._bias" [E, 2 ffn], and
// "<prefix>experts.down_proj" [E, ffn, hidden] with "..._bias" [E, hidden].
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tilemoe/safetensors.hpp"
#include "tilemoe/shared_expert.hpp"
#include "tilemoe/step_io.hpp"
#include "tilemoe/weights.hpp"

namespace tilemoe {

// A tensor's values as a layer holds them (rounded to `dtype`), refused when one is NaN or
// infinite: such a value poisons every output it reaches the same way in every strategy, so the
// run would fail its checks for a reason that is the file's, not tilemoe's.
std::vector<float> read_finite(const safetensors::File& file, const safetensors::TensorInfo& info, DType dtype);

// How a fused gate_up_proj holds the two matrices (the names do not tell).
enum class FusedLayout : std::uint8_t {
  GateRowsThenUpRows,      // transformers 5: [E, 2 ffn, hidden], no biases
  InterleavedColumns,      // GPT-OSS: [E, hidden, 2 ffn], gate and up alternating, with biases
  ConcatenatedColumns,     // Llama-4: [E, hidden, 2 ffn], gate columns then up columns, no biases
};

class LayerTensors {
 public:
  // `files`, opened with safetensors::File::open_header(), hold the layer's tensors among
  // others. `prefix`: the layer's (a model directory knows it), or nullopt for the one prefix
  // that every expert tensor of the files shares (a weights file holds one layer: tensors of
  // two prefixes are refused). `source` names the files in messages.
  LayerTensors(std::vector<safetensors::File> files, std::string source, std::optional<std::string> prefix,
               FusedLayout fused_layout = FusedLayout::GateRowsThenUpRows);
  LayerTensors(const LayerTensors&) = delete;  // it points into its files
  LayerTensors& operator=(const LayerTensors&) = delete;

  const std::string& prefix() const { return prefix_; }
  WeightsShape shape() const;
  // The routed experts in the layer's shape, dtype and activation.
  ExpertWeights experts(const MoeConfig& layer) const;
  // The router "<prefix><module>": its weight ([experts, hidden], rounded to `gate_dtype`), bias
  // and selection bias ("e_score_correction_bias"), each empty when the files have none.
  RouterTensors router(std::int64_t experts, std::int64_t hidden, DType gate_dtype, std::string_view module = "gate.") const;
  // The shared expert "<prefix><module>{gate_proj,up_proj,down_proj}.weight" of `ffn_hidden`,
  // gated by "<prefix><gate_module>weight" ([1, hidden]) when gate_module is not empty.
  SharedExpert shared_expert(const MoeConfig& layer, std::int64_t ffn_hidden, std::string_view module,
                             std::string_view gate_module) const;

 private:
  struct Located {
    const safetensors::File* file = nullptr;
    const safetensors::TensorInfo* info = nullptr;
  };
  const Located* find(std::string_view name) const;
  const Located& get(std::string_view name) const;  // bad input naming the tensor when absent
  // The column layouts: gate_up_proj [E, hidden, 2 ffn] and down_proj [E, ffn, hidden] (x W, not W x).
  ExpertWeights column_experts(const MoeConfig& layer, ExpertWeights weights) const;
  // `name`'s values, checked to be of `shape`, finite once rounded to `dtype`.
  std::vector<float> read(std::string_view name, const std::vector<std::int64_t>& shape, DType dtype, std::string_view needed_for) const;

  std::vector<safetensors::File> files_;
  std::string source_;
  std::map<std::string, Located, std::less<>> by_name_;
  std::string prefix_;
  bool fused_ = false;
  FusedLayout fused_layout_;
  std::map<std::int64_t, std::map<std::string, std::string>> by_expert_;  // e -> {"w1": name, ...}
};

}  // namespace tilemoe
