#!/usr/bin/env python3
"""Writes the seed corpus of the safetensors fuzzer into fuzz/corpus/safetensors/.

A few tiny files, valid and invalid, so that the fuzzer starts from inputs that reach
deep into the parser instead of having to discover the format from random bytes.
Deterministic: running it again rewrites the same bytes. Pure python, no third-party
modules. Run once after changing it and commit the output.
"""
import json
import os
import struct

CORPUS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors")


def safetensors_bytes(header_text, data=b"", pad=True):
    """Length prefix (u64 little-endian), header, data; the header is padded with spaces
    to a multiple of 8 bytes as the reference writer does, unless pad is False."""
    header = header_text.encode("utf-8")
    if pad:
        header += b" " * ((8 - len(header) % 8) % 8)
    return struct.pack("<Q", len(header)) + header + data


def header_json(entries, metadata=None):
    """The compact, key-sorted JSON of a header. entries: name -> (dtype, shape, begin, end)."""
    header = {
        name: {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
        for name, (dtype, shape, begin, end) in entries.items()
    }
    if metadata:
        header["__metadata__"] = metadata
    return json.dumps(header, sort_keys=True, separators=(",", ":"))


def f32(*values):
    return struct.pack("<%df" % len(values), *values)


def seeds():
    # Valid: an F32 matrix, a BF16 vector (1.0, -2.0, 0.5), a zero-row tensor, metadata.
    bf16 = struct.pack("<3H", 0x3F80, 0xC000, 0x3F00)
    yield "valid_f32_bf16_metadata.safetensors", safetensors_bytes(
        header_json(
            {
                "w1": ("F32", [2, 2], 0, 16),
                "w2": ("BF16", [3], 16, 22),
                "empty": ("F32", [0, 4], 22, 22),
            },
            {"format": "pt"},
        ),
        f32(1.0, -2.0, 3.5, 0.0) + bf16,
    )
    # Valid: F16 and I32 tensors with a hole between them.
    yield "valid_f16_i32_holes.safetensors", safetensors_bytes(
        header_json({"h": ("F16", [2], 0, 4), "ids": ("I32", [1], 8, 12)}),
        struct.pack("<2H", 0x3C00, 0x0001) + b"\0" * 4 + struct.pack("<i", 7),
    )
    # Invalid: bytes after the last tensor (a file cut and padded, or two files joined).
    yield "invalid_trailing_bytes.safetensors", safetensors_bytes(
        header_json({"w": ("F32", [1], 0, 4)}), f32(1.0) + b"\0" * 4
    )
    # Valid: nothing but an empty header.
    yield "valid_empty.safetensors", safetensors_bytes("{}")
    # Invalid: two tensors whose byte ranges overlap.
    yield "invalid_overlap.safetensors", safetensors_bytes(
        header_json({"a": ("F32", [2], 0, 8), "b": ("F32", [2], 4, 12)}), f32(1, 2, 3)
    )
    # Invalid: the same tensor name twice (only raw text can say that).
    entry = '"w":{"data_offsets":[0,4],"dtype":"F32","shape":[1]}'
    yield "invalid_duplicate_name.safetensors", safetensors_bytes(
        "{" + entry + "," + entry + "}", f32(1.0)
    )
    # Invalid: data_offsets span 8 bytes, but the shape needs 12; unknown dtype next to it.
    yield "invalid_size_mismatch.safetensors", safetensors_bytes(
        header_json({"w": ("F32", [3], 0, 8), "x": ("F8_E4M3", [1], 8, 9)}), f32(1, 2) + b"\0"
    )
    # Invalid: the header length points past the end of the file.
    yield "invalid_header_length.safetensors", struct.pack("<Q", 4096) + b'{"w":{}}'


def main():
    os.makedirs(CORPUS_DIR, exist_ok=True)
    for name, content in seeds():
        with open(os.path.join(CORPUS_DIR, name), "wb") as out:
            out.write(content)
        print("%s: %d bytes" % (name, len(content)))


if __name__ == "__main__":
    main()
