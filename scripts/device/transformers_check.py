#!/usr/bin/env python3
"""tilemoe's MoE output against Hugging Face transformers' own MoE modules, on fresh random data.

For each family (Mixtral, Qwen3-MoE with and without norm_topk_prob, DeepSeek-V3's routed
experts, GPT-OSS's router) and each dtype (fp32, bf16) and token count, the script draws
weights and inputs (numpy, seeded, every seed printed), runs the transformers module on them
(torch, on the GPU when there is one), writes the same tensors as safetensors files in tilemoe's
layout (Mixtral's per-expert names), runs `tilemoe run` on the CPU engine and, in bf16, on the GPU
(with a GPU), and compares the outputs. One line per case; a JSON
summary with --json; exit 0 when every case is within its dtype's tolerance, 1 otherwise, 2 on
bad arguments.

What each case calls in transformers (5.x: experts are fused 3-D parameters, gate_up_proj
[E, 2F, H] with the gate rows first and down_proj [E, H, F], both applied as nn.Linear weights,
so tilemoe's w1 = gate_up_proj[e, :F], w3 = gate_up_proj[e, F:], w2 = down_proj[e], untransposed):
  mixtral             MixtralSparseMoeBlock.forward (MixtralTopKRouter + MixtralExperts)
  qwen3-moe[-norm]    Qwen3MoeSparseMoeBlock.forward, norm_topk_prob false / true
  deepseek-v3[-nonorm] DeepseekV3MoE.forward with the shared expert's down_proj zeroed (see
                      TransformersSide.deepseek_v3 for why that is the routed experts' output)
  gpt-oss[-router-bias] GptOssTopKRouter.forward, its indices and scores fed to MixtralExperts:
                      tilemoe has neither GPT-OSS's expert biases nor its clamped SwiGLU and its
                      CLI cannot print or save a routing, so the router rule is checked through
                      a Mixtral-style expert block (transformers' own, not our math)
  deepseek-v3-negative-bias  DeepSeek-V3 with selection biases below -1, so that every biased
                      score is negative: the experts of the groups not kept must still never be
                      chosen (transformers 5.x masks them with -inf, DeepseekV3TopkRouter.forward,
                      as tilemoe does; 4.x's 0.0 would choose them).

--reference fp64 replaces transformers by this script's own fp64 math (numpy only): a check of
the files, options and comparison on a machine without torch, not the comparison the script
exists for. The fp64 result is also reported next to every transformers comparison, as context.

Usage: transformers_check.py --tilemoe BUILD/tilemoe [--json FILE] [--family NAME ...]
       [--tokens 1,33,300] [--seed N] [--gpu auto|on|off] [--reference transformers|fp64]
"""
import argparse
import json
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from dataclasses import dataclass

try:
    import numpy as np
except ImportError:  # transformers depends on numpy, so only a bare machine lacks it
    print("transformers_check: numpy is needed (pip install numpy)", file=sys.stderr)
    sys.exit(1)

# ---------------------------------------------------------------------------------------------
# Tolerances: max |tilemoe - expected| / max |expected| over a case's whole output.
# fp32: the sums differ only in order and in exp/sigmoid (cuBLAS's tiling against tilemoe's
#   ascending K); tilemoe's earlier external check saw 3e-7, and tilemoe against this script's
#   fp64 math gave at most 8.5e-7 on these cases. 2^-16 (1.5e-5) leaves over 10x headroom and
#   still catches a bf16 rounding slipping into the fp32 path (>= 2^-9).
# bf16: tilemoe rounds at three points (GEMM0 + activation, GEMM1, the combine); transformers at
#   more (gate and up separately, the activation, their product, down_proj, the weighted row,
#   then k-1 bf16 additions in index_add_; Qwen3 and GPT-OSS also round the routing weights to
#   bf16). tilemoe against fp64 gave at most 6.8e-3 here, and against a numpy emulation of
#   transformers' rounding sequence at most 1.35e-2 (each side about 3-4 bf16 half-units of 2^-9
#   from the exact value, in opposite directions at worst). 2^-5 (3.1e-2) leaves 2x headroom.
# Both stay below what a real bug costs: one slot of one token routed to the next-best expert
# moved these outputs by 1.1e-2 to 0.9 of their scale (median 0.1-0.5), and a wrong rule moves
# many tokens, so the largest error over a case is at least the median's; a missing
# renormalisation or scaling, a bias used in the weights or a transposed matrix cost 10-100%.
TOLERANCE = {"fp32": 2.0 ** -16, "bf16": 2.0 ** -5}

DEFAULT_TOKENS = (1, 33, 300)
DEFAULT_SEED = 20261206
PREFIX_MIXTRAL = "model.layers.0.block_sparse_moe."  # the checkpoint names of each family
PREFIX_MLP = "model.layers.0.mlp."


@dataclass(frozen=True)
class Family:
    name: str
    module: str  # what transformers computes, for the report
    experts: int
    top_k: int
    hidden: int
    ffn: int
    rule: str  # "softmax" (Mixtral, Qwen), "deepseek" (sigmoid, bias, groups), "gpt-oss" (top-k of logits, softmax of the k)
    renormalize: bool
    groups: int = 1
    top_groups: int = 1
    scaling: float = 1.0
    selection_bias: str = ""  # "", "mixed" (both signs, around 0) or "negative" (the opt-in case)
    router_bias: bool = False  # GPT-OSS's router bias: tilemoe has none, so it takes transformers' logits
    prefix: str = PREFIX_MLP

    @property
    def logits_in_fp32(self):
        # DeepSeek-V3's router computes its logits in fp32 whatever the model dtype; Mixtral, Qwen
        # and GPT-OSS in the model dtype (then tilemoe rounds its fp32 sums to bf16 as well)
        return self.rule == "deepseek"


FAMILIES = [
    Family("mixtral", "MixtralSparseMoeBlock", 8, 2, 128, 224, "softmax", True, prefix=PREFIX_MIXTRAL),
    Family("qwen3-moe", "Qwen3MoeSparseMoeBlock(norm_topk_prob=False)", 16, 4, 128, 96, "softmax", False),
    Family("qwen3-moe-norm", "Qwen3MoeSparseMoeBlock(norm_topk_prob=True)", 16, 4, 128, 96, "softmax", True),
    Family("deepseek-v3", "DeepseekV3MoE routed experts (shared expert zeroed)", 32, 8, 256, 64, "deepseek", True,
           groups=8, top_groups=4, scaling=2.5, selection_bias="mixed"),
    Family("deepseek-v3-nonorm", "DeepseekV3MoE routed experts, norm_topk_prob=False", 32, 6, 256, 64, "deepseek", False,
           groups=8, top_groups=4, scaling=1.5, selection_bias="mixed"),
    Family("gpt-oss", "GptOssTopKRouter -> MixtralExperts", 16, 4, 128, 128, "gpt-oss", False),
    Family("gpt-oss-router-bias", "GptOssTopKRouter (router bias) -> MixtralExperts", 16, 4, 128, 128, "gpt-oss", False,
           router_bias=True),
    Family("deepseek-v3-negative-bias", "DeepseekV3MoE routed experts, every kept biased score < 0", 32, 8, 256, 64,
           "deepseek", True, groups=8, top_groups=4, scaling=2.5, selection_bias="negative"),
]
FAMILY_BY_NAME = {f.name: f for f in FAMILIES}


# ---------------------------------------------------------------------------------------------
# bf16 in numpy (which has no bf16): values are kept as float32 that bf16 represents exactly, so
# that transformers, tilemoe and the fp64 math all see the same numbers.

def bf16_bits(a):
    """Round-to-nearest-even float32 -> bf16 bit patterns (finite data only)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF).astype(np.uint16)


def from_bf16_bits(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def round_to(dtype, a):
    a = np.asarray(a, dtype=np.float32)
    return from_bf16_bits(bf16_bits(a)).reshape(a.shape) if dtype == "bf16" else a


# ---------------------------------------------------------------------------------------------
# safetensors: a writer and a reader of the two element types used here, so that the CLI side
# needs nothing beyond numpy (the format: 8-byte little-endian header length, JSON header,
# data; the header padded with spaces to 8 bytes as the reference writer does).

def write_safetensors(path, tensors):
    """tensors: {name: (element type "F32" or "BF16", float32 array)}"""
    header, blobs, offset = {}, [], 0
    for name, (etype, array) in tensors.items():
        array = np.asarray(array, dtype=np.float32)
        raw = bf16_bits(array).astype("<u2").tobytes() if etype == "BF16" else array.astype("<f4").tobytes()
        header[name] = {"dtype": etype, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body = data[8 + length:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = body[begin:end]
        if info["dtype"] == "F32":
            values = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        elif info["dtype"] == "BF16":
            values = from_bf16_bits(np.frombuffer(raw, dtype="<u2"))
        else:
            raise ValueError(f"{path}: tensor {name} has element type {info['dtype']}, expected F32 or BF16")
        out[name] = values.reshape(info["shape"])
    return out


# ---------------------------------------------------------------------------------------------
# The routing rules in fp64, written from the rules' description (shared/reference,
# include/tilemoe/routing.hpp), not from transformers' code. Used to screen out ties (below), as
# the reference of --reference fp64, and as context next to every transformers comparison.

def softmax_rows(a):
    a = a - a.max(axis=1, keepdims=True)
    e = np.exp(a)
    return e / e.sum(axis=1, keepdims=True)


def route_fp64(fam, logits, bias, use_bias=True, use_groups=True):
    """-> (indices [T, k], weights [T, k], margin [T]). The margin is the smallest gap at any
    decision of the selection (k-th vs (k+1)-th choice score, top_groups-th vs next group score), in the space
    the choice is made in (logits for softmax and GPT-OSS, biased sigmoid scores for DeepSeek)."""
    logits = logits.astype(np.float64)
    tokens, experts = logits.shape
    k = fam.top_k
    if fam.rule == "softmax":
        scores = softmax_rows(logits)
        choice = logits.copy()  # softmax keeps the logits' order; gaps measured where rounding happens
    elif fam.rule == "deepseek":
        scores = 1.0 / (1.0 + np.exp(-logits))
        choice = scores + (bias.astype(np.float64) if (use_bias and bias is not None) else 0.0)
    else:
        scores = logits
        choice = logits.copy()
    margin = np.full(tokens, np.inf)
    grouped = use_groups and fam.groups > 1
    if grouped:
        per_group = experts // fam.groups
        top2 = -np.sort(-choice.reshape(tokens, fam.groups, per_group), axis=2)[:, :, :2].sum(axis=2)
        group_order = np.argsort(-top2, axis=1, kind="stable")
        if fam.top_groups < fam.groups:
            ranked = np.take_along_axis(top2, group_order, axis=1)
            margin = np.minimum(margin, ranked[:, fam.top_groups - 1] - ranked[:, fam.top_groups])
        keep = np.zeros((tokens, fam.groups), dtype=bool)
        np.put_along_axis(keep, group_order[:, :fam.top_groups], True, axis=1)
        # the other groups' experts are never chosen (-inf, as transformers 5.x and tilemoe mask them)
        choice = np.where(np.repeat(keep, per_group, axis=1), choice, -np.inf)
    order = np.argsort(-choice, axis=1, kind="stable")
    ranked = np.take_along_axis(choice, order, axis=1)
    if k < experts:
        with np.errstate(invalid="ignore"):
            gap = ranked[:, k - 1] - ranked[:, k]
        margin = np.minimum(margin, np.where(np.isfinite(gap), gap, np.inf))
    indices = order[:, :k]
    weights = np.take_along_axis(scores, indices, axis=1)
    if fam.rule == "gpt-oss":
        weights = softmax_rows(weights)
    if fam.renormalize:
        weights = weights / (weights.sum(axis=1, keepdims=True) + (1e-20 if fam.rule == "deepseek" else 0.0))
    return indices, weights * fam.scaling, margin


def experts_fp64(data, indices, weights):
    """SwiGLU experts, w2(silu(w1 x) * w3 x), weighted and summed over the k choices."""
    x = data["x"].astype(np.float64)
    out = np.zeros_like(x)
    for e in np.unique(indices):
        token, slot = np.nonzero(indices == e)  # a token picks an expert at most once
        xe = x[token]
        g = xe @ data["w1"][e].astype(np.float64).T
        u = xe @ data["w3"][e].astype(np.float64).T
        h = g / (1.0 + np.exp(-g)) * u
        out[token] += weights[token, slot][:, None] * (h @ data["w2"][e].astype(np.float64).T)
    return out


def fp64_logits(data):
    logits = data["x"].astype(np.float64) @ data["gate"].astype(np.float64).T
    if data.get("router_bias") is not None:
        logits = logits + data["router_bias"].astype(np.float64)
    return logits


def tie_threshold(fam, dtype, logits):
    """Per token: the smallest decision gap both sides are sure to resolve alike."""
    if fam.logits_in_fp32 or dtype == "fp32":
        # fp32 logits on both sides differ by ~1e-6 (summation order); sigmoid only shrinks that
        return np.full(logits.shape[0], 1e-4)
    # logits rounded to bf16 on both sides (transformers' bf16 linear, tilemoe's
    # --router-logits-dtype bf16): two logits more than two bf16 spacings (2^-7 relative) apart
    # stay distinct and in order whichever fp32 sum was rounded
    return 2.0 ** -6 * np.abs(logits).max(axis=1) + 1e-4


# ---------------------------------------------------------------------------------------------
# Data: every tensor drawn fresh per case from its own seed; bf16 cases draw bf16 values.

def case_seed(base, fam, dtype, tokens):
    return (base * 7919 + zlib.crc32(f"{fam.name}/{dtype}/{tokens}".encode())) % (2 ** 31)


def make_data(fam, dtype, tokens, seed):
    rng = np.random.default_rng(seed)
    E, H, F = fam.experts, fam.hidden, fam.ffn

    def uniform(shape, bound):
        return round_to(dtype, rng.uniform(-bound, bound, size=shape))

    data = {
        # unit-variance-preserving expert weights (uniform(-a, a), a = sqrt(3 / fan_in)), so the
        # outputs are O(1); router logits with a spread of about 1.5, so routing is neither
        # uniform nor one-hot
        "w1": uniform((E, F, H), math.sqrt(3.0 / H)),
        "w3": uniform((E, F, H), math.sqrt(3.0 / H)),
        "w2": uniform((E, H, F), math.sqrt(3.0 / F)),
        "gate": uniform((E, H), 4.5 / math.sqrt(H)),
        "x": uniform((tokens, H), 1.0),
        "bias": None,
        "router_bias": None,
    }
    if fam.selection_bias == "mixed":  # enough to change many choices, small against sigmoid's (0, 1)
        data["bias"] = round_to("bf16", rng.uniform(-0.25, 0.25, size=E))
    elif fam.selection_bias == "negative":
        data["bias"] = round_to("bf16", rng.uniform(-1.25, -1.0, size=E))  # below -sigmoid: every biased score < 0
    if fam.router_bias:
        data["router_bias"] = round_to(dtype, rng.uniform(-1.0, 1.0, size=E))
    # Ties: where two candidates are closer than rounding can resolve, transformers and tilemoe
    # may legitimately choose differently (and torch.topk's order among equals is unspecified).
    # Such tokens are redrawn from the same generator (deterministic), and their count reported.
    redrawn = 0
    for _ in range(100):
        logits = fp64_logits(data)
        _, _, margin = route_fp64(fam, logits, data["bias"])
        close = np.nonzero(margin <= tie_threshold(fam, dtype, logits))[0]
        if close.size == 0:
            break
        redrawn += close.size
        data["x"][close] = uniform((close.size, H), 1.0)
    else:
        raise RuntimeError(f"{fam.name}: tokens with near-tied router choices after 100 redraws (seed {seed})")
    data["redrawn"] = redrawn
    data["seed"] = seed
    for name in ("w1", "w3", "w2", "gate", "x"):  # never an all-zero tensor
        if not np.any(data[name]):
            raise RuntimeError(f"{fam.name}: drew an all-zero {name} (seed {seed})")
    return data


# ---------------------------------------------------------------------------------------------
# transformers: the only part that needs torch. Each family builds the module from a config of
# the case's shape, copies the drawn tensors in (shapes checked), runs its forward in the case's
# dtype and returns the output (and the router logits where tilemoe takes them from here).

class TransformersSide:
    def __init__(self, device):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network on the GPU machine: never wait on the hub
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        import transformers

        self.torch = torch
        self.version = transformers.__version__
        self.torch_version = torch.__version__
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.device_name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        # the reference as exact as the module allows: no TF32 for fp32 (DeepSeek's fp32 router
        # would otherwise choose on 10-bit products), no bf16 partial sums in bf16 GEMMs. Only one
        # of torch's two TF32 APIs is touched: since 2.9 mixing them raises at the next read.
        matmul = torch.backends.cuda.matmul
        if hasattr(matmul, "fp32_precision"):
            matmul.fp32_precision = "ieee"
        else:
            torch.set_float32_matmul_precision("highest")
        try:
            matmul.allow_bf16_reduced_precision_reduction = False
        except (AttributeError, RuntimeError):  # a refinement, not a condition of the check
            pass
        if int(self.version.split(".")[0]) < 5:
            raise RuntimeError(f"transformers {self.version}: this check reads 5.x's fused expert parameters")

    def _dtype(self, dtype):
        return {"fp32": self.torch.float32, "bf16": self.torch.bfloat16}[dtype]

    def _load(self, tensor, array):
        """Copy a drawn array into a module's parameter or buffer of exactly that shape."""
        source = self.torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
        if tuple(tensor.shape) != tuple(source.shape):
            raise RuntimeError(f"transformers tensor of shape {tuple(tensor.shape)}, drawn {tuple(source.shape)}")
        with self.torch.no_grad():
            tensor.copy_(source)

    def _load_experts(self, experts, data):
        # 5.x fused experts: gate_up_proj [E, 2F, H] applied as F.linear(x, gate_up_proj[e]) and
        # chunked gate-first; down_proj [E, H, F] applied as F.linear(h, down_proj[e])
        self._load(experts.gate_up_proj, np.concatenate([data["w1"], data["w3"]], axis=1))
        self._load(experts.down_proj, data["w2"])

    @staticmethod
    def _expect(module, **settings):
        """The module took the case's settings from the config (a renamed field would not)."""
        got = {name: getattr(module, name) for name in settings}
        if got != settings:
            raise RuntimeError(f"{type(module).__name__} has {got}, the case wants {settings}")

    def _x(self, data, dtype):
        return self.torch.from_numpy(data["x"]).to(self.device, self._dtype(dtype))

    def _out(self, tensor):
        if isinstance(tensor, tuple):  # a block that also returns its router logits
            tensor = tensor[0]
        return tensor.detach().float().cpu().numpy().reshape(-1, tensor.shape[-1])

    def run(self, fam, data, dtype):
        with self.torch.no_grad():
            if fam.name.startswith("mixtral"):
                return self.mixtral(fam, data, dtype)
            if fam.name.startswith("qwen3"):
                return self.qwen3_moe(fam, data, dtype)
            if fam.rule == "deepseek":
                return self.deepseek_v3(fam, data, dtype)
            return self.gpt_oss(fam, data, dtype)

    def _mixtral_config(self, fam):
        from transformers.models.mixtral.configuration_mixtral import MixtralConfig

        config = MixtralConfig(hidden_size=fam.hidden, intermediate_size=fam.ffn, num_local_experts=fam.experts,
                               num_experts_per_tok=fam.top_k, hidden_act="silu", num_hidden_layers=1,
                               num_attention_heads=4, num_key_value_heads=4, router_jitter_noise=0.0)
        config._experts_implementation = "eager"  # the module's own loop, not a fused kernel
        return config

    def mixtral(self, fam, data, dtype):
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

        block = MixtralSparseMoeBlock(self._mixtral_config(fam))
        self._expect(block.gate, top_k=fam.top_k, num_experts=fam.experts)
        self._load(block.gate.weight, data["gate"])
        self._load_experts(block.experts, data)
        block = block.to(self.device, self._dtype(dtype)).eval()
        return {"output": self._out(block(self._x(data, dtype)[None]))}

    def qwen3_moe(self, fam, data, dtype):
        from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        config = Qwen3MoeConfig(hidden_size=fam.hidden, intermediate_size=fam.ffn, moe_intermediate_size=fam.ffn,
                                num_experts=fam.experts, num_experts_per_tok=fam.top_k, norm_topk_prob=fam.renormalize,
                                hidden_act="silu", num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4)
        config._experts_implementation = "eager"
        block = Qwen3MoeSparseMoeBlock(config)
        self._expect(block.gate, top_k=fam.top_k, num_experts=fam.experts, norm_topk_prob=fam.renormalize)
        self._load(block.gate.weight, data["gate"])
        self._load_experts(block.experts, data)
        block = block.to(self.device, self._dtype(dtype)).eval()
        return {"output": self._out(block(self._x(data, dtype)[None]))}

    def deepseek_v3(self, fam, data, dtype):
        from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

        config = DeepseekV3Config(hidden_size=fam.hidden, intermediate_size=fam.ffn, moe_intermediate_size=fam.ffn,
                                  n_routed_experts=fam.experts, num_experts_per_tok=fam.top_k, n_group=fam.groups,
                                  topk_group=fam.top_groups, norm_topk_prob=fam.renormalize,
                                  routed_scaling_factor=fam.scaling, n_shared_experts=1, first_k_dense_replace=0,
                                  hidden_act="silu", num_hidden_layers=1)
        config._experts_implementation = "eager"
        moe = DeepseekV3MoE(config)
        gate = moe.gate
        self._expect(gate, top_k=fam.top_k, num_experts=fam.experts, num_group=fam.groups, topk_group=fam.top_groups,
                     norm_topk_prob=fam.renormalize, routed_scaling_factor=fam.scaling)
        self._load(gate.weight, data["gate"])
        self._load(gate.e_score_correction_bias, data["bias"])
        self._load_experts(moe.experts, data)
        # The shared expert, which tilemoe lacks: DeepseekV3MoE.forward adds
        # shared_experts(residuals) to the routed experts' sum. Its down_proj is zeroed, so that
        # term is exactly 0 (any h @ 0 is 0, and y + 0 == y in every dtype) and the module's own
        # forward (router, experts, reshapes) returns exactly the routed part. Calling gate() and
        # experts() by hand would skip forward's wiring; subtracting the shared output would add
        # a rounding. Its gate/up keep random weights, so a zeroing that failed would show.
        rng = np.random.default_rng(data["seed"] + 1)
        shared = moe.shared_experts
        self._load(shared.gate_proj.weight, rng.uniform(-0.1, 0.1, size=tuple(shared.gate_proj.weight.shape)))
        self._load(shared.up_proj.weight, rng.uniform(-0.1, 0.1, size=tuple(shared.up_proj.weight.shape)))
        self._load(shared.down_proj.weight, np.zeros(tuple(shared.down_proj.weight.shape), dtype=np.float32))
        moe = moe.to(self.device, self._dtype(dtype)).eval()
        # from_pretrained keeps the bias in fp32 (_keep_in_fp32_modules_strict); .to() does not
        moe.gate.e_score_correction_bias = moe.gate.e_score_correction_bias.float()
        x = self._x(data, dtype)[None]
        if self.torch.count_nonzero(moe.shared_experts(x)).item() != 0:
            raise RuntimeError("the zeroed shared expert still contributes")
        return {"output": self._out(moe(x))}

    def gpt_oss(self, fam, data, dtype):
        from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter
        from transformers.models.mixtral.modeling_mixtral import MixtralExperts

        config = GptOssConfig(hidden_size=fam.hidden, intermediate_size=fam.ffn, num_local_experts=fam.experts,
                              num_experts_per_tok=fam.top_k, num_hidden_layers=1, num_attention_heads=4,
                              num_key_value_heads=4, head_dim=32)
        router = GptOssTopKRouter(config)
        self._expect(router, top_k=fam.top_k, num_experts=fam.experts)
        self._load(router.weight, data["gate"])
        # tilemoe has no router bias: zero here when tilemoe computes the logits from the gate,
        # drawn when it takes transformers' logits (the router_bias case)
        bias = data["router_bias"] if data["router_bias"] is not None else np.zeros(fam.experts, dtype=np.float32)
        self._load(router.bias, bias)
        router = router.to(self.device, self._dtype(dtype)).eval()
        experts = MixtralExperts(self._mixtral_config(fam))
        self._load_experts(experts, data)
        experts = experts.to(self.device, self._dtype(dtype)).eval()
        x = self._x(data, dtype)  # GptOssTopKRouter takes [tokens, hidden] (it softmaxes over dim 1)
        logits, scores, indices = router(x)
        return {"output": self._out(experts(x, indices, scores)),
                "router_logits": logits.detach().float().cpu().numpy()}


# ---------------------------------------------------------------------------------------------
# tilemoe's CLI

def tilemoe_rule_args(fam, dtype):
    args = ["--top-k", str(fam.top_k)]
    if fam.renormalize:
        args.append("--renormalize")
    if fam.rule == "deepseek":
        args += ["--score-function", "sigmoid", "--expert-groups", str(fam.groups), "--top-groups", str(fam.top_groups),
                 "--routed-scaling", repr(fam.scaling)]
        if fam.renormalize:
            args += ["--renormalize-epsilon", "1e-20"]
    elif fam.rule == "gpt-oss":
        args += ["--score-function", "logits", "--router-weights", "softmax-of-selected"]
    if not fam.router_bias:  # logits from the weights file's gate: in the family's dtype
        args += ["--router-logits-dtype", "fp32" if fam.logits_in_fp32 else dtype]
    return args


def write_step_files(fam, dtype, data, logits, folder):
    etype = "F32" if dtype == "fp32" else "BF16"
    inputs = {"input": (etype, data["x"])}
    if logits is not None:  # transformers' own logits (GPT-OSS's router bias): tilemoe routes from them
        inputs["router_logits"] = (etype, logits)
    weights = {}
    for e in range(fam.experts):
        base = f"{fam.prefix}experts.{e}."
        weights[base + "w1.weight"] = (etype, data["w1"][e])  # [ffn, hidden]: gate
        weights[base + "w3.weight"] = (etype, data["w3"][e])  # [ffn, hidden]: up
        weights[base + "w2.weight"] = (etype, data["w2"][e])  # [hidden, ffn]: down
    if logits is None:
        weights[fam.prefix + "gate.weight"] = (etype, data["gate"])  # [experts, hidden]
    if data["bias"] is not None:
        weights[fam.prefix + "gate.e_score_correction_bias"] = ("F32", data["bias"])
    paths = os.path.join(folder, "inputs.safetensors"), os.path.join(folder, "weights.safetensors")
    write_safetensors(paths[0], inputs)
    write_safetensors(paths[1], weights)
    return paths


def run_tilemoe(binary, backend, fam, dtype, paths, folder, timeout_s):
    """-> (output array or None, exit code, argv, message (stderr's last line, or what went
    wrong), the CLI's own JSON report or None, the whole stderr)"""
    output = os.path.join(folder, f"output-{backend}.safetensors")
    if os.path.exists(output):  # poison: a file from an earlier call can never pass for this one
        os.remove(output)
    ranks = ["--ranks", "2", "--link-mbps", "0"] if backend == "cpu" else ["--ranks", "1"]  # CPU: two ranks, every strategy
    argv = [binary, "run", "--backend", backend, *ranks, "--dtype", dtype, *tilemoe_rule_args(fam, dtype),
            "--inputs", paths[0], "--weights", paths[1], "--output", output, "--json"]
    # coreutils timeout: TERM, then KILL 5 s later; Python's own limit only as a last resort. The
    # call runs in a process group of its own, killed whole if this script is interrupted (an
    # outer timeout's TERM) or the last resort fires, so that no tilemoe outlives the script.
    command = ["timeout", "-k", "5", str(timeout_s), *argv]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s + 15)
    except BaseException as error:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if isinstance(error, subprocess.TimeoutExpired):
            return None, 124, argv, f"no exit within {timeout_s + 15} s", None, ""
        raise
    report = None
    try:
        report = json.loads(stdout)
    except ValueError:
        pass
    message = (stderr.strip().splitlines() or [""])[-1]
    if proc.returncode != 0:
        return None, proc.returncode, argv, ("timed out" if proc.returncode == 124 else message), report, stderr
    if not os.path.exists(output):
        return None, 0, argv, "exit 0 but no --output file", report, stderr
    return read_safetensors(output).get("output"), 0, argv, "", report, stderr


# ---------------------------------------------------------------------------------------------

def compare(got, expected):
    scale = float(np.max(np.abs(expected)))
    if got is None or got.shape != expected.shape:
        return math.inf, scale, math.inf
    if not np.all(np.isfinite(got)):
        return math.inf, scale, math.inf
    err = float(np.max(np.abs(got.astype(np.float64) - expected.astype(np.float64))))
    return err, scale, (err / scale if scale > 0 else math.inf)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tilemoe", required=True, help="the tilemoe CLI binary")
    parser.add_argument("--json", help="write the summary here")
    parser.add_argument("--family", action="append", choices=[f.name for f in FAMILIES],
                        help="only these families (repeatable; default: all)")
    parser.add_argument("--dtype", action="append", choices=["fp32", "bf16"], help="only these dtypes (default both)")
    parser.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)), help="token counts, e.g. 1,33,300")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="base seed; each case's seed derives from it")
    parser.add_argument("--gpu", choices=["auto", "on", "off"], default="auto",
                        help="run the CUDA backend where its router runs the rule (auto: when torch sees a GPU)")
    parser.add_argument("--reference", choices=["transformers", "fp64"], default="transformers",
                        help="fp64: this script's own math instead of transformers (a harness check without torch)")
    parser.add_argument("--torch-device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--timeout-s", type=int, default=60, help="bound of each tilemoe call")
    parser.add_argument("--deadline-s", type=float, default=180, help="cases not started by then fail as not run")
    parser.add_argument("--keep", help="keep each case's files under this folder (default: a temporary one, removed)")
    args = parser.parse_args(argv)
    if not (os.path.isfile(args.tilemoe) and os.access(args.tilemoe, os.X_OK)):
        parser.error(f"--tilemoe {args.tilemoe}: not an executable file")
    try:
        args.tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        parser.error(f"--tokens {args.tokens!r}: give counts like 1,33,300")
    if not args.tokens or min(args.tokens) < 1 or max(args.tokens) > 4096:
        parser.error("--tokens: each count between 1 and 4096 (the check is meant to be small)")
    if args.seed < 0:
        parser.error("--seed: use 0 or more")
    if args.timeout_s < 1 or args.deadline_s <= 0:
        parser.error("--timeout-s and --deadline-s must be positive")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        parser.error(f"--json {args.json}: its folder does not exist")
    if args.keep and not os.path.isdir(args.keep):
        parser.error(f"--keep {args.keep}: not a folder")
    args.families = [FAMILY_BY_NAME[n] for n in args.family] if args.family else list(FAMILIES)
    args.dtypes = args.dtype or ["fp32", "bf16"]
    return args


def finite_or_none(value):
    """JSON has no Infinity or NaN: a comparison that could not be made is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_or_none(v) for v in value]
    return value


def shown(value, folder):
    """The case's files by name only: the temporary folder says nothing."""
    if isinstance(value, list):
        return [shown(v, folder) for v in value]
    return value.replace(folder + os.sep, "") if isinstance(value, str) else value


def run_case(args, hf, gpu, binary, fam, dtype, tokens, folder):
    """One family, dtype and token count: fresh data, the expected output, tilemoe on the CPU
    engine (and the GPU where it runs the rule). -> the entries for the summary, one per run."""
    seed = case_seed(args.seed, fam, dtype, tokens)
    name = f"{fam.name} {dtype} T={tokens}"
    base = {"case": fam.name, "module": fam.module, "dtype": dtype, "tokens": tokens, "seed": seed,
            "experts": fam.experts, "top_k": fam.top_k, "hidden": fam.hidden, "ffn": fam.ffn}
    data = make_data(fam, dtype, tokens, seed)
    logits64 = fp64_logits(data)
    idx64, w64, _ = route_fp64(fam, logits64, data["bias"])
    fp64 = experts_fp64(data, idx64, w64)
    info = {"redrawn_tokens": data["redrawn"]}
    blind = ""
    if fam.rule == "deepseek":
        # the bias and the groups must change choices, else this case could not tell whether
        # tilemoe applies them (required at the largest token count; counted at every one)
        def changed(**without):
            other = route_fp64(fam, logits64, data["bias"], **without)[0]
            return int(np.sum(np.any(np.sort(other, axis=1) != np.sort(idx64, axis=1), axis=1)))

        info["choices_changed_by_bias"] = changed(use_bias=False)
        info["choices_changed_by_groups"] = changed(use_groups=False)
        if tokens == max(args.tokens) and tokens >= 33 and min(info["choices_changed_by_bias"],
                                                              info["choices_changed_by_groups"]) == 0:
            blind = "the bias or the groups changed no choice on this data: the case cannot see them"
    if hf is not None:
        got_hf = hf.run(fam, data, dtype)
        expected = got_hf["output"]
        logits_for_tilemoe = got_hf["router_logits"] if fam.router_bias else None
        info["transformers_vs_fp64"] = compare(expected, fp64)[2]
    else:
        expected = fp64.astype(np.float32)
        logits_for_tilemoe = round_to(dtype, logits64) if fam.router_bias else None
    if expected.shape != data["x"].shape or not np.any(expected):
        raise RuntimeError(f"{name}: the expected output is all zeros or misshapen (seed {seed})")
    paths = write_step_files(fam, dtype, data, logits_for_tilemoe, folder)
    entries = []
    for backend in ["cpu"] + (["cuda"] if gpu and dtype == "bf16" else []):  # the CUDA backend stores bf16 only
        got, code, argv, message, report, _ = run_tilemoe(binary, backend, fam, dtype, paths, folder, args.timeout_s)
        err, scale, rel = compare(got, expected)
        tol = TOLERANCE[dtype]
        ok = code == 0 and rel <= tol and not blind
        note = "; ".join(n for n in (message, blind) if n)
        entry = {**base, **info, "backend": backend, "status": "PASS" if ok else "FAIL", "exit_code": code,
                 "max_abs_error": err, "output_scale": scale, "relative_error": rel, "tolerance": tol,
                 "tilemoe_vs_fp64": compare(got, fp64)[2] if got is not None else None,
                 "tilemoe_args": [os.path.basename(argv[0])] + shown(argv[1:], folder), "note": note}
        if report is not None:
            entry["cli_report"] = {k: shown(report[k], folder) for k in ("all_bitwise_equal", "within_tolerance",
                                                                          "relative_error_vs_cpu", "source") if k in report}
        entries.append(entry)
        context = f" (transformers vs fp64 {info['transformers_vs_fp64']:.1e})" if hf is not None else ""
        print(f"{entry['status']} {backend:4s} {name:34s} seed={seed:<10d} max|err|={err:.2e} scale={scale:.3g} "
              f"rel={rel:.2e} tol={tol:.1e}{context} redrawn={data['redrawn']}"
              + (f" exit={code}" if code else "") + (f": {note}" if note else ""), flush=True)
    return entries


def main(argv):
    args = parse_args(argv)
    start = time.monotonic()
    # an outer timeout's TERM still writes the summary (the finally below)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    binary = os.path.abspath(args.tilemoe)
    summary = {"reference": args.reference, "base_seed": args.seed, "tolerance": TOLERANCE,
               "tolerance_metric": "max |tilemoe - expected| / max |expected| over the case's output",
               "cases": [], "passed": False}
    hf = None
    if args.reference == "transformers":
        try:
            hf = TransformersSide(args.torch_device)
        except ImportError as error:
            print(f"transformers_check: {error}: torch and transformers are needed (or --reference fp64)", file=sys.stderr)
            return 1
        summary.update(transformers=hf.version, torch=hf.torch_version, torch_device=str(hf.device),
                       device_name=hf.device_name)
        gpu = args.gpu == "on" or (args.gpu == "auto" and hf.torch.cuda.is_available())
    else:
        gpu = args.gpu == "on"
    summary["gpu"] = gpu
    print(f"transformers_check: reference {args.reference}"
          + (f" (transformers {hf.version}, torch {hf.torch_version}, on {hf.device_name})" if hf else "")
          + f"; base seed {args.seed}; GPU runs {'on' if gpu else 'off'}; tolerance fp32 {TOLERANCE['fp32']:.2e}, "
          + f"bf16 {TOLERANCE['bf16']:.2e} of max|expected|", flush=True)
    work = args.keep or tempfile.mkdtemp(prefix="transformers_check.")
    try:
        for fam in args.families:
            for dtype in args.dtypes:
                for tokens in args.tokens:
                    if time.monotonic() - start > args.deadline_s:
                        summary["cases"].append({"case": fam.name, "dtype": dtype, "tokens": tokens, "status": "FAIL",
                                                 "note": f"not run: past --deadline-s {args.deadline_s:g}"})
                        print(f"FAIL      {fam.name} {dtype} T={tokens}: not run, past the deadline of {args.deadline_s:g} s")
                        continue
                    folder = os.path.join(work, f"{fam.name}-{dtype}-{tokens}")
                    os.makedirs(folder, exist_ok=True)
                    try:
                        summary["cases"].extend(run_case(args, hf, gpu, binary, fam, dtype, tokens, folder))
                    except Exception as error:  # one family's trouble (a transformers API change, say) spares the others
                        where = traceback.extract_tb(error.__traceback__)[-1]
                        note = f"harness error: {type(error).__name__}: {error} (line {where.lineno}, {where.name})"
                        summary["cases"].append({"case": fam.name, "dtype": dtype, "tokens": tokens, "status": "FAIL",
                                                 "note": note})
                        print(f"FAIL      {fam.name} {dtype} T={tokens}: {note}", flush=True)
    except SystemExit:
        summary["note"] = "interrupted (TERM) before every case ran"
        raise
    finally:
        failures = sum(c["status"] == "FAIL" for c in summary["cases"])
        summary["failures"] = failures
        summary["passed"] = failures == 0 and bool(summary["cases"])
        summary["seconds"] = round(time.monotonic() - start, 1)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(finite_or_none(summary), f, indent=1)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"transformers_check: {len(summary['cases']) - failures} passed, {failures} failed, {summary['seconds']} s")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
