"""Turns the JSON lines of cuda_layer_bench (--json) and bench/torch_reference.py (--json) from
one device call into the Markdown tables of BENCHMARKS.md.

    python3 bench/report.py bench.json torch.json
"""
import json
import sys


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(bench_path, torch_path):
    bench = load(bench_path)
    torch_runs = {(r["shape"], r["tokens"], r["routing"]): r for r in load(torch_path)}
    rates = next(r for r in bench if r["kind"] == "rates")
    layers = [r for r in bench if r["kind"] == "layer"]
    print(f"Rates: cuBLAS bf16 8192^3 {rates['matrix_tflops']:.0f} TFLOP/s, device copy {rates['copy_gbps']:.0f} GB/s.\n")
    print("| shape | tokens | routing | tilemoe layer | floor | layer / floor | tilemoe FFN | FFN TFLOP/s | cuBLAS-loop FFN "
          "| PyTorch FFN | PyTorch layer | FFN vs PyTorch | layer vs PyTorch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in layers:
        t = torch_runs[(r["shape"], r["tokens"], r["routing"])]
        print(f"| {r['shape']} | {r['tokens']} | {r['routing']} | {r['total_ms']:.3f} | {r['floor_ms']:.3f} "
              f"| {r['total_ms'] / r['floor_ms']:.2f} | {r['ffn_ms']:.3f} | {r['flops'] / r['ffn_ms'] / 1e9:.0f} "
              f"| {r['cublas_loop_ffn_ms']:.3f} | {t['ffn_ms']:.3f} | {t['layer_ms']:.3f} "
              f"| {t['ffn_ms'] / r['ffn_ms']:.2f}x | {t['layer_ms'] / r['total_ms']:.2f}x |")
    stages = ["router", "layout", "permute", "gemm0", "activation", "gemm1", "combine"]
    print("\nPer stage (ms):\n")
    print("| shape | tokens | routing | " + " | ".join(stages) + " |")
    print("|---|---|---|" + "---|" * len(stages))
    for r in layers:
        print(f"| {r['shape']} | {r['tokens']} | {r['routing']} | " + " | ".join(f"{r[s + '_ms']:.3f}" for s in stages) + " |")
    configs = list(layers[0]["gemm_configs_ms"])
    print("\nEach GEMM configuration on the same rows (GEMM0 / GEMM1 ms):\n")
    print("| shape | tokens | routing | " + " | ".join(configs) + " |")
    print("|---|---|---|" + "---|" * len(configs))
    for r in layers:
        cells = []
        best = min(configs, key=lambda c: sum(r["gemm_configs_ms"][c]))
        for c in configs:
            g0, g1 = r["gemm_configs_ms"][c]
            cell = f"{g0:.3f} / {g1:.3f}"
            cells.append(f"**{cell}**" if c == best else cell)
        print(f"| {r['shape']} | {r['tokens']} | {r['routing']} | " + " | ".join(cells) + " |")
    if "planned_ms" not in layers[0]:
        return
    print("\nThe layer on the planned GEMM (default) vs the same layer on the stock kernels, same call (ms):\n")
    print("| shape | tokens | routing | planned | layer | FFN | stock layer | stock FFN | FFN stock / planned |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in layers:
        print(f"| {r['shape']} | {r['tokens']} | {r['routing']} | {r['gemm']} | {r['total_ms']:.3f} | {r['ffn_ms']:.3f} "
              f"| {r['stock_total_ms']:.3f} | {r['stock_ffn_ms']:.3f} | {r['stock_ffn_ms'] / r['ffn_ms']:.3f} |")
    print("\nCost of the ready-flag hook: planned GEMM time with one release add per tile (and with two"
          " timestamps more) over the same tiles without flags:\n")
    print("| shape | tokens | routing | cluster | GEMM0+SwiGLU ms | with flags | GEMM1 ms | with flags | flags + times |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in layers:
        for cl, p in r["planned_ms"].items():
            print(f"| {r['shape']} | {r['tokens']} | {r['routing']} | {cl} | {p['gemm0_ms']:.3f} "
                  f"| {p['gemm0_flags_ms'] / p['gemm0_ms']:.3f}x | {p['gemm1_ms']:.3f} "
                  f"| {p['gemm1_flags_ms'] / p['gemm1_ms']:.3f}x | {p['gemm1_flags_times_ms'] / p['gemm1_ms']:.3f}x |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
