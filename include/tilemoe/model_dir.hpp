#pragma once
// A Hugging Face model directory as transformers saves it: config.json, and the weights in
// model.safetensors or in the shards that model.safetensors.index.json lists (its weight_map).
// One MoE layer is read at a time, and only its tensors: the headers of the shards that hold
// them, then their bytes.
//
// The families read (config.json's model_type) and what each layer takes from its config
// (transformers' modules are the reference; NOTES.md names the ones matched):
//   mixtral      "model.layers.N.block_sparse_moe.": num_local_experts, num_experts_per_tok,
//                intermediate_size; softmax top-k, always renormalised; every layer is MoE
//   qwen2_moe    "model.layers.N.mlp.": num_experts (or num_local_experts), num_experts_per_tok, moe_intermediate_size,
//                norm_topk_prob; a shared expert of shared_expert_intermediate_size gated by
//                sigmoid(shared_expert_gate(x)); MoE where N is not in mlp_only_layers and
//                (N + 1) % decoder_sparse_step == 0
//   qwen3_moe    as qwen2_moe, without the shared expert
//   deepseek_v3  "model.layers.N.mlp.": n_routed_experts (or num_local_experts), num_experts_per_tok,
//                moe_intermediate_size; sigmoid scores, e_score_correction_bias, n_group /
//                topk_group, norm_topk_prob (epsilon 1e-20), routed_scaling_factor, the gate
//                kept and applied in fp32; n_shared_experts shared experts; MoE from layer
//                first_k_dense_replace on
//   gpt_oss      "model.layers.N.mlp.": num_local_experts, num_experts_per_tok, intermediate_size;
//                the router "router." with its bias, top-k of the logits, a softmax over the k
//                chosen; experts with biases in GPT-OSS's interleaved gate_up_proj, the SwiGLU
//                clamped at swiglu_limit with swiglu_alpha and (up + 1); every layer is MoE
// Every other model_type is refused naming the families read.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tilemoe/config.hpp"
#include "tilemoe/step_io.hpp"
#include "tilemoe/weights.hpp"

namespace tilemoe {

// What one MoE layer of a model is, from config.json alone.
struct ModelLayer {
  std::string model_type;
  std::int64_t index = 0;
  MoeConfig layer;                        // tokens 0; dtype the model's unless asked otherwise
  DType gate_dtype = DType::BF16;         // the router gate's stored values (DeepSeek keeps fp32)
  DType router_logits_dtype = DType::BF16;  // what the gate's product is rounded to
  std::string prefix;                     // of the block's tensors, e.g. "model.layers.3.mlp."
  std::string router_module = "gate.";    // the router's, after the prefix (GPT-OSS: "router.")
  bool interleaved_experts = false;       // GPT-OSS's fused, interleaved gate_up_proj with biases
  bool concatenated_experts = false;      // Llama-4's fused gate_up_proj [E, hidden, 2 ffn], gate columns first
  std::int64_t shared_ffn_hidden = 0;     // the shared expert's width; 0: none
  bool shared_gated = false;              // scaled by sigmoid(x . shared_expert_gate)
};

// The tensors of one MoE layer, read.
struct ModelLayerWeights {
  ExpertWeights experts;  // with the shared expert, if the layer has one
  RouterTensors router;   // the gate (always present in a model) and the selection bias, if any
};

class ModelDirectory {
 public:
  // Reads config.json and the shard index (or finds model.safetensors); bad input naming the
  // file for anything missing or malformed, or a model_type not read.
  static ModelDirectory open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::string& model_type() const { return model_type_; }
  std::int64_t layer_count() const { return layer_count_; }
  // Layer `index`'s MoE configuration; `dtype`, when given, replaces the model's. Bad input
  // for an index out of range or a dense layer, naming the MoE layers.
  ModelLayer layer(std::int64_t index, std::optional<DType> dtype = std::nullopt) const;
  // Reads that layer's router, experts and shared expert from the shards that hold them.
  ModelLayerWeights load(const ModelLayer& layer) const;

 private:
  std::string path_, model_type_;
  std::int64_t layer_count_ = 0;
  std::string config_text_;                       // config.json, parsed again per layer
  std::map<std::string, std::string> shard_of_;   // tensor name -> shard file (absolute)
};

}  // namespace tilemoe
