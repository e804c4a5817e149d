#!/usr/bin/env python3
"""Makes the model fixtures of tests/fixtures/models with Hugging Face transformers itself.

Each fixture is a tiny random model of one family, saved by `save_pretrained` (config.json and
safetensors, sharded or whole, per-expert or fused), and `block_case.safetensors`: an input of one
MoE layer, what transformers' own MoE block of that layer returns for it ("expected"), and the
experts its router chose ("experts", [tokens, top_k], in no particular order). Tokens whose choice
is nearly tied (a selection margin under 1e-3) are drawn again, so that the experts are the same
for any correct router. The CPU tests (test_model_dir.cpp) run tilemoe on them; `--check DIR`
loads every checked-in model of DIR with from_pretrained, runs its block on the checked-in input
and compares with the checked-in answer (the device script runs it, so the files cannot go stale
against the transformers it has: a loader or a block that changed shows there).

  python3 scripts/make_model_fixtures.py OUT_DIR           make the fixtures in OUT_DIR
  python3 scripts/make_model_fixtures.py --check DIR       rerun transformers on DIR's fixtures
Needs torch and transformers (5.x).
"""
import argparse
import os
import sys

import torch
import transformers
from safetensors.torch import save_file, load_file

TOKENS = 24
MARGIN = 1e-3


def common(**extra):
    base = dict(vocab_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
                max_position_embeddings=32)
    base.update(extra)
    return base


# name -> (config, dtype, MoE layer, save options)
CASES = {
    "mixtral_fp32": (lambda: transformers.MixtralConfig(intermediate_size=16, num_local_experts=4, num_experts_per_tok=2,
                                                        **common()), torch.float32, 1, {}),
    "mixtral_bf16_sharded": (lambda: transformers.MixtralConfig(intermediate_size=16, num_local_experts=8, num_experts_per_tok=2,
                                                                **common()), torch.bfloat16, 2, {"max_shard_size": "20KB"}),
    "qwen2_moe_fp32": (lambda: transformers.Qwen2MoeConfig(intermediate_size=24, moe_intermediate_size=16,
                                                           shared_expert_intermediate_size=24, num_experts=8, num_experts_per_tok=2,
                                                           norm_topk_prob=False, **common()), torch.float32, 1, {}),
    "qwen3_moe_bf16_fused": (lambda: transformers.Qwen3MoeConfig(intermediate_size=24, moe_intermediate_size=16, num_experts=8,
                                                                 num_experts_per_tok=2, norm_topk_prob=True, head_dim=16,
                                                                 **common()), torch.bfloat16, 0, {"save_original_format": False}),
    "deepseek_v3_fp32": (lambda: transformers.DeepseekV3Config(intermediate_size=24, moe_intermediate_size=16, n_routed_experts=16,
                                                               num_experts_per_tok=4, n_group=4, topk_group=2, first_k_dense_replace=1,
                                                               n_shared_experts=2, routed_scaling_factor=2.5, q_lora_rank=None,
                                                               kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                                                               **common()), torch.float32, 2, {}),
    "deepseek_v3_bf16": (lambda: transformers.DeepseekV3Config(intermediate_size=24, moe_intermediate_size=16, n_routed_experts=8,
                                                               num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
                                                               n_shared_experts=1, routed_scaling_factor=2.5, q_lora_rank=None,
                                                               kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                                                               **common()), torch.bfloat16, 1, {}),
    "gpt_oss_fp32": (lambda: transformers.GptOssConfig(intermediate_size=16, num_local_experts=8, num_experts_per_tok=2, head_dim=16,
                                                       **common()), torch.float32, 1, {}),
    "gpt_oss_bf16": (lambda: transformers.GptOssConfig(intermediate_size=16, num_local_experts=4, num_experts_per_tok=2, head_dim=16,
                                                       **common()), torch.bfloat16, 0, {}),
    # Llama-4 (text): top-1, the router's sigmoid scales the expert's input; every other layer MoE
    "llama4_fp32": (lambda: transformers.Llama4TextConfig(intermediate_size=16, intermediate_size_mlp=24, num_local_experts=4,
                                                          num_experts_per_tok=1, head_dim=16, interleave_moe_layer_step=2,
                                                          **common()), torch.float32, 1, {}),
    "llama4_bf16": (lambda: transformers.Llama4TextConfig(intermediate_size=16, intermediate_size_mlp=24, num_local_experts=8,
                                                          num_experts_per_tok=1, head_dim=16, interleave_moe_layer_step=1,
                                                          **common()), torch.bfloat16, 2, {}),
    # Llama-4 as released: Llama4ForConditionalGeneration, the text model's config under text_config
    # and its tensors under "language_model." (a tiny vision tower beside it)
    "llama4_multimodal_bf16": (lambda: transformers.Llama4Config(
        text_config=dict(intermediate_size=16, intermediate_size_mlp=24, num_local_experts=4, num_experts_per_tok=1, head_dim=16,
                         interleave_moe_layer_step=2, **common()),
        vision_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, image_size=28, patch_size=14,
                           vision_output_dim=16, projector_input_dim=16, projector_output_dim=16)), torch.bfloat16, 1, {}),
}

# GPT-OSS's gate and up clamp at 7: its gate_up_proj is drawn this much larger, so that some do
GPT_OSS_GATE_UP_SCALE = 4.0


def router_of(block):
    return block.gate if hasattr(block, "gate") else block.router


def decoder_layers(model):
    return model.language_model.model.layers if hasattr(model, "language_model") else model.model.layers


def new_model(config):
    if isinstance(config, transformers.Llama4Config):  # the multimodal model, saved as released
        return transformers.Llama4ForConditionalGeneration(config)
    return transformers.AutoModelForCausalLM.from_config(config)


def moe_block(model, layer):
    decoder = decoder_layers(model)[layer]
    for name in ("block_sparse_moe", "feed_forward", "mlp"):  # Mixtral, Llama-4, the others
        if hasattr(decoder, name):
            return getattr(decoder, name)
    raise SystemExit(f"layer {layer} has no MoE block")


def margins_ok(block, x):
    """Per token: is its choice of experts clear by MARGIN (groups included)?"""
    gate = router_of(block)
    with torch.no_grad():
        if hasattr(block, "router"):  # GPT-OSS, Llama-4: top-k of the logits themselves
            choice = torch.nn.functional.linear(x, gate.weight, gate.bias).float()
            ok = torch.ones(x.shape[0], dtype=torch.bool)
        elif hasattr(gate, "e_score_correction_bias"):  # DeepSeek-V3
            logits = torch.nn.functional.linear(x.float(), gate.weight.float())
            choice = logits.sigmoid() + gate.e_score_correction_bias
            groups = choice.view(x.shape[0], gate.num_group, -1)
            group_scores = groups.topk(2, dim=-1)[0].sum(-1)
            g = group_scores.sort(dim=-1, descending=True)[0]
            ok = (g[:, gate.topk_group - 1] - g[:, gate.topk_group]) > MARGIN if gate.topk_group < gate.num_group else torch.ones(
                x.shape[0], dtype=torch.bool)
            kept = group_scores.topk(gate.topk_group, dim=-1)[1]
            mask = torch.zeros_like(group_scores).scatter_(1, kept, 1).bool()
            choice = groups.masked_fill(~mask.unsqueeze(-1), float("-inf")).view(x.shape[0], -1)
        else:
            logits = torch.nn.functional.linear(x, gate.weight)
            choice = torch.softmax(logits.float(), dim=-1)
            ok = torch.ones(x.shape[0], dtype=torch.bool)
        s = choice.sort(dim=-1, descending=True)[0]
        return ok & ((s[:, gate.top_k - 1] - s[:, gate.top_k]) > MARGIN)


def run_block(block, x):
    """The block's output for tokens x [T, hidden] (GPT-OSS's block returns its router scores too)."""
    with torch.no_grad():
        out = block(x.unsqueeze(0))
    return (out[0] if isinstance(out, tuple) else out).reshape(x.shape[0], -1)


def chosen_experts(block, x):
    router = router_of(block)
    with torch.no_grad():
        out = router(x)
    if len(out) == 2:  # Llama-4's router returns (scores, logits): its choice is the top-k of the logits
        return out[1].topk(router.top_k, dim=-1)[1].to(torch.int32)
    return out[2].to(torch.int32)


def make_case(name, out_dir):
    make_config, dtype, layer, save_options = CASES[name]
    torch.manual_seed(sum(map(ord, name)))
    config = make_config()
    model = new_model(config).to(dtype).eval()
    block = moe_block(model, layer)
    with torch.no_grad():  # weights of unit scale, so that the outputs are O(1) and routing is not flat
        for param_name, param in block.named_parameters():
            scale = GPT_OSS_GATE_UP_SCALE if param_name == "experts.gate_up_proj" and hasattr(block, "router") else 1.0
            param.copy_(torch.randn_like(param, dtype=torch.float32).to(param.dtype) * param.shape[-1] ** -0.5 * scale)
        if hasattr(block, "gate") and hasattr(block.gate, "e_score_correction_bias"):
            block.gate.e_score_correction_bias.copy_(torch.randn_like(block.gate.e_score_correction_bias) * 0.1)
    hidden = config.get_text_config().hidden_size
    x = torch.randn(TOKENS, hidden).to(dtype)
    for _ in range(100):
        bad = ~margins_ok(block, x)
        if not bad.any():
            break
        x[bad] = torch.randn(int(bad.sum()), hidden).to(dtype)
    else:
        raise SystemExit(f"{name}: could not draw inputs without near ties")
    expected = run_block(block, x)
    case_dir = os.path.join(out_dir, name)
    model.save_pretrained(case_dir, **save_options)
    if os.path.exists(os.path.join(case_dir, "generation_config.json")):
        os.remove(os.path.join(case_dir, "generation_config.json"))
    save_file({"input": x.contiguous(), "expected": expected.contiguous(), "experts": chosen_experts(block, x).contiguous()},
              os.path.join(case_dir, "block_case.safetensors"), metadata={"layer": str(layer), "transformers": transformers.__version__})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir")
    parser.add_argument("--check", action="store_true", help="remake the fixtures and compare them with DIR's")
    parser.add_argument("--only", action="append", choices=sorted(CASES), help="make only this fixture (repeatable)")
    args = parser.parse_args()
    if not args.check:
        names = args.only or list(CASES)
        for name in names:
            make_case(name, args.dir)
        print(f"made {len(names)} fixtures in {args.dir} with transformers {transformers.__version__}")
        return 0
    failures = 0
    for name, (_, dtype, layer, _) in CASES.items():
        case_dir = os.path.join(args.dir, name)
        case = load_file(os.path.join(case_dir, "block_case.safetensors"))
        model = transformers.AutoModelForCausalLM.from_pretrained(case_dir, dtype=dtype).eval()
        block = moe_block(model, layer)
        x = case["input"]
        now = run_block(block, x).float()
        scale = case["expected"].float().abs().max().item()
        diff = (case["expected"].float() - now).abs().max().item() / scale
        same_experts = torch.equal(case["experts"].sort(-1)[0], chosen_experts(block, x).sort(-1)[0])
        ok = same_experts and diff <= (1e-5 if dtype == torch.float32 else 1e-2)
        failures += not ok
        print(f"{name}: experts {'same' if same_experts else 'DIFFER'}, output within {diff:.2e} of its scale: {'ok' if ok else 'STALE'}")
    print(f"transformers {transformers.__version__}: {len(CASES) - failures}/{len(CASES)} fixtures as checked in")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
