"""PyTorch baseline of the MoE layer forward on one GPU, for tilemoe's benchmarks.

The same shapes and routing patterns as bench/cuda_layer_bench.cu: softmax + top-k routing,
argsort permute, torch._grouped_mm for GEMM0 (gate/up) and GEMM1, SwiGLU, index_add combine.
Times the whole layer and the expert FFN alone (CUDA events, warm-up, median of 25 runs,
inputs rotated through more than the L2). Prints a table; --json FILE writes JSON lines.
"""
import argparse
import json
import math

import torch


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def timed(fn, runs=25, warmup=3):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for i in range(runs + warmup):
        start.record()
        fn(i)
        end.record()
        end.synchronize()
        if i >= warmup:
            out.append(start.elapsed_time(end))
    return median(out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--case", action="append", default=[], metavar="NAME:TOKENS",
                        help="only these cases (repeatable), e.g. mixtral-8x7b:16384")
    args = parser.parse_args()
    cases = set()
    for text in args.case:
        name, _, count = text.partition(":")
        if not count.isdigit():
            parser.error(f"--case wants NAME:TOKENS, not {text!r}")
        cases.add((name, int(count)))
    sink = open(args.json, "w") if args.json else None
    dev = torch.device("cuda")
    shapes = [("mixtral-8x7b", 4096, 14336, 8, 2), ("qwen3-30b-a3b", 2048, 768, 128, 8), ("deepseek-v3", 7168, 2048, 256, 8)]
    token_counts = [4096] if args.quick else [512, 4096, 16384]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'shape':14s} {'tokens':>6s} {'routing':8s} | {'layer ms':>9s} {'ffn ms':>9s} {'ffn TFLOP/s':>11s}")
    for name, hidden, ffn, experts, top_k in shapes:
        if cases and not any(c[0] == name for c in cases):
            continue
        gen = torch.Generator(device=dev).manual_seed(7)
        w13 = (torch.rand(experts, 2 * ffn, hidden, device=dev, generator=gen) * 2 - 1).mul_(math.sqrt(3 / hidden)).bfloat16()
        w2 = (torch.rand(experts, hidden, ffn, device=dev, generator=gen) * 2 - 1).mul_(math.sqrt(3 / ffn)).bfloat16()
        w13_t, w2_t = w13.transpose(1, 2), w2.transpose(1, 2)  # [E, K, N] views of the [E, N, K] weights
        for tokens in token_counts:
            if cases and (name, tokens) not in cases:
                continue
            rotations = max(2, min(32, (256 << 20) // (tokens * hidden * 2) + 1))
            xs = [(torch.rand(tokens, hidden, device=dev, generator=gen) * 2 - 1).bfloat16() for _ in range(rotations)]
            for routing in ("balanced", "skewed"):
                logits = torch.randn(tokens, experts, device=dev, generator=gen)
                if routing == "skewed":
                    logits -= 1.5 * torch.log(torch.arange(1, experts + 1, device=dev, dtype=torch.float32))

                def ffn_rows(rows, offsets):
                    h = torch._grouped_mm(rows, w13_t, offs=offsets)
                    gate, up = h[:, 0::2], h[:, 1::2]  # gate/up interleaved rows, as tilemoe stores them
                    act = torch.nn.functional.silu(gate) * up
                    return torch._grouped_mm(act, w2_t, offs=offsets)

                def layer(i):
                    x = xs[i % rotations]
                    probs = torch.softmax(logits, dim=-1)
                    weights, ids = torch.topk(probs, top_k, dim=-1)
                    flat = ids.reshape(-1)
                    order = torch.argsort(flat, stable=True)
                    counts = torch.bincount(flat, minlength=experts)
                    offsets = torch.cumsum(counts, 0).to(torch.int32)
                    rows = x[order // top_k]
                    y = ffn_rows(rows, offsets)
                    out = torch.zeros(tokens, hidden, device=dev, dtype=torch.float32)
                    out.index_add_(0, order // top_k, y.float() * weights.reshape(-1)[order].unsqueeze(1))
                    return out.bfloat16()

                layer_ms = timed(layer)
                flat = torch.topk(torch.softmax(logits, -1), top_k, -1)[1].reshape(-1)
                order = torch.argsort(flat, stable=True)
                offsets = torch.cumsum(torch.bincount(flat, minlength=experts), 0).to(torch.int32)
                rows_all = [x[order // top_k].contiguous() for x in xs]
                ffn_ms = timed(lambda i: ffn_rows(rows_all[i % rotations], offsets))
                rows = tokens * top_k
                flops = 2 * rows * hidden * 2 * ffn + 2 * rows * ffn * hidden
                print(f"{name:14s} {tokens:6d} {routing:8s} | {layer_ms:9.3f} {ffn_ms:9.3f} {flops / ffn_ms / 1e9:11.0f}")
                if sink:
                    sink.write(json.dumps({"kind": "torch", "shape": name, "tokens": tokens, "routing": routing,
                                           "layer_ms": layer_ms, "ffn_ms": ffn_ms, "torch": torch.__version__}) + "\n")
                    sink.flush()
            del xs
        del w13, w2
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
