#!/usr/bin/env python3
"""Writes the seed corpus of the run-inputs fuzzer into fuzz/corpus/run_inputs/.

One seed is a flags byte, a 16-bit little-endian length n, an --inputs file of n bytes and a
--weights file (the rest); see run_inputs_fuzz.cpp for the flags. Small valid steps and the
bad files issue 25 found, so that the fuzzer starts deep in the input path. Deterministic,
pure python. Run once after changing it and commit the output.
"""

import json
import math
import os
import struct

CORPUS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "run_inputs")

INPUTS, WEIGHTS, HIDDEN_8, EXPERTS_2, FFN_8, GELU, FP32, TWO_RANKS = 1, 2, 4, 8, 16, 32, 64, 128


def safetensors_bytes(tensors):
    """tensors: name -> (dtype, shape, raw bytes), laid out in name order, header padded to 8."""
    header, data = {}, b""
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def values(count, seed):
    return [math.sin(seed * 0.37 + i * 0.11) for i in range(count)]


def inputs_file(tokens=6, hidden=8, experts=2, edit=None):
    x = values(tokens * hidden, 1)
    if edit:
        edit(x)
    return safetensors_bytes({
        "input": ("F32", [tokens, hidden], f32(x)),
        "router_logits": ("F32", [tokens, experts], f32(values(tokens * experts, 2))),
    })


def weights_file(hidden=8, ffn=8, experts=2, parts=("w1", "w3", "w2"), index=str, prefix="m."):
    tensors = {}
    for e in range(experts):
        for p in parts:
            shape = [hidden, ffn] if p == "w2" else [ffn, hidden]
            tensors["%sexperts.%s.%s.weight" % (prefix, index(e), p)] = ("F32", shape, f32(values(hidden * ffn, e * 3 + len(p))))
    return safetensors_bytes(tensors)


def seed(flags, inputs, weights):
    return bytes([flags]) + struct.pack("<H", len(inputs)) + inputs + weights


def seeds():
    yield "valid_both_files", seed(INPUTS | WEIGHTS, inputs_file(), weights_file())
    yield "valid_both_files_options_agree", seed(INPUTS | WEIGHTS | HIDDEN_8 | EXPERTS_2 | FFN_8 | FP32, inputs_file(), weights_file())
    yield "valid_two_ranks_gelu", seed(INPUTS | WEIGHTS | GELU | TWO_RANKS, inputs_file(), weights_file(parts=("w1", "w2")))
    yield "valid_weights_only", seed(WEIGHTS, b"", weights_file())
    yield "invalid_hidden_disagrees", seed(INPUTS | WEIGHTS, inputs_file(hidden=16), weights_file())
    yield "invalid_leading_zero_index", seed(INPUTS | WEIGHTS, inputs_file(), weights_file(index=lambda e: "0%d" % e))
    yield "invalid_nan_input", seed(INPUTS | WEIGHTS, inputs_file(edit=lambda x: x.__setitem__(5, float("nan"))), weights_file())
    yield "invalid_trailing_bytes", seed(INPUTS | WEIGHTS, inputs_file() + b"\0" * 8, weights_file())


def main():
    os.makedirs(CORPUS_DIR, exist_ok=True)
    for name, data in seeds():
        with open(os.path.join(CORPUS_DIR, name), "wb") as out:
            out.write(data)
        print("%s: %d bytes" % (name, len(data)))


if __name__ == "__main__":
    main()
