"""Turns the JSON lines of cuda_layer_bench (--json) and bench/torch_reference.py (--json) from
one device call into the Markdown tables of BENCHMARKS.md.

    python3 bench/report.py bench.json [torch.json]

bench.json may hold several runs of the bench (one process per case): each case is measured
against the rates line that precedes it. Cases PyTorch did not run show "n/a".
"""
import json
import sys


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def span(values):
    """'lo-hi' of the values, or one value when they agree (rounded to whole numbers)."""
    v = sorted(values)
    return f"{v[0]:.0f}" if round(v[0]) == round(v[-1]) else f"{v[0]:.0f}-{v[-1]:.0f}"


def ratio(num, den, digits=2):
    return f"{num / den:.{digits}f}x" if num is not None and den else "n/a"


def ms(value):
    return f"{value:.3f}" if value is not None else "n/a"


def main(bench_path, torch_path=None):
    bench = load(bench_path)
    torch_runs = {(r["shape"], r["tokens"], r["routing"]): r for r in load(torch_path)} if torch_path else {}
    layers, rates, all_rates = [], None, []
    for r in bench:
        if r["kind"] == "rates":
            rates = r
            all_rates.append(r)
        elif r["kind"] == "layer":
            if rates is None:
                sys.exit(f"{bench_path}: a layer case before any rates line")
            r["rates"] = rates
            layers.append(r)
    if not layers:
        sys.exit(f"{bench_path}: no layer cases")
    runs = f"{len(all_rates)} run{'s' if len(all_rates) > 1 else ''} of the bench"
    print(f"Rates ({runs}): cuBLAS bf16 8192^3 {span(r['matrix_tflops'] for r in all_rates)} TFLOP/s, device copy "
          f"{span(r['copy_gbps'] for r in all_rates)} GB/s.\n")
    print("| shape | tokens | routing | tilemoe layer | floor | layer / floor | tilemoe FFN | FFN TFLOP/s | cuBLAS-loop FFN "
          "| PyTorch FFN | PyTorch layer | FFN vs PyTorch | layer vs PyTorch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in layers:
        t = torch_runs.get((r["shape"], r["tokens"], r["routing"]), {})
        print(f"| {r['shape']} | {r['tokens']} | {r['routing']} | {r['total_ms']:.3f} | {r['floor_ms']:.3f} "
              f"| {r['total_ms'] / r['floor_ms']:.2f} | {r['ffn_ms']:.3f} | {r['flops'] / r['ffn_ms'] / 1e9:.0f} "
              f"| {r['cublas_loop_ffn_ms']:.3f} | {ms(t.get('ffn_ms'))} | {ms(t.get('layer_ms'))} "
              f"| {ratio(t.get('ffn_ms'), r['ffn_ms'])} | {ratio(t.get('layer_ms'), r['total_ms'])} |")
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
    if "dense_gemm0_ms" in layers[0]:
        print_ceilings(layers)
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
    print_planned_ab(layers, "The padding-MMA skip: the planned GEMM in its default mode (skipping the MMAs of warp"
                     " groups whose 64 rows are all padding; 2x1 issued them before 08d7382) against the same tiles with every MMA"
                     " issued (ms; below 1.00x the default is faster)", ("default", ""), ("all MMAs", "_all_mma"))
    print_planned_ab(layers, "The item fetch: the planned GEMM (default padding MMAs) with clusters taking items in a"
                     " static stride against claiming the next item from a counter (ms; below 1.00x the dynamic fetch"
                     " is faster)", ("dynamic", "_dynamic"), ("static", "_static"))


def print_planned_ab(layers, title, a, b):
    """One A/B table of the planned GEMMs alone: variant a against variant b, each a (label, key
    infix) pair naming gemm0<infix>_ms / gemm1<infix>_ms; runs without those keys are skipped."""
    (a_name, a_key), (b_name, b_key) = a, b
    print(f"\n{title}:\n")
    print(f"| shape | tokens | routing | cluster | GEMM0 {a_name} | GEMM0 {b_name} | {a_name} / {b_name} "
          f"| GEMM1 {a_name} | GEMM1 {b_name} | {a_name} / {b_name} |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in layers:
        for cl, p in r["planned_ms"].items():
            keys = [f"gemm{g}{k}_ms" for g in (0, 1) for k in (a_key, b_key)]
            if any(k not in p for k in keys):
                continue  # runs from before this timing
            g0a, g0b, g1a, g1b = (p[k] for k in keys)
            print(f"| {r['shape']} | {r['tokens']} | {r['routing']} | {cl} | {g0a:.3f} | {g0b:.3f} | {g0a / g0b:.2f}x "
                  f"| {g1a:.3f} | {g1b:.3f} | {g1a / g1b:.2f}x |")


# NVML clocks-event reasons (nvml.h): the ones that lower the SM clock under load
REASONS = {0x4: "power cap", 0x8: "hw slowdown", 0x20: "sync boost", 0x40: "sw thermal", 0x80: "hw thermal",
           0x100: "power brake"}


def reasons(clock):
    bits = int(clock.get("reasons", "0x0"), 16)
    return ", ".join(name for bit, name in REASONS.items() if bits & bit) or "none"


def print_ceilings(layers):
    at = span(r["rates"].get("matrix_clock", {}).get("mean_sm_mhz", 0) for r in layers)
    print(f"\nCeilings of the FFN, same call. The 8192^3 rate was measured at {at} MHz. Dense = the same FLOPs as one cuBLAS product per GEMM (all rows against one "
          "expert's weights); padded = each expert's rows rounded up to the 128-row tile, the FLOPs a 128-row tile "
          "kernel computes; clocks are NVML samples while the case was timed.\n")
    print("| shape | tokens | routing | tilemoe FFN | FFN floor | padded-tile floor | rows computed / routed "
          "| dense cuBLAS GEMM0 + GEMM1 | dense TFLOP/s | tilemoe FFN TFLOP/s | SM MHz (layer) | W (layer) | MHz (dense) "
          "| clock limits seen |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in layers:
        dense = r["dense_gemm0_ms"] + r["dense_gemm1_ms"]
        lc, dc = r["layer_clock"], r["dense_clock"]
        rows = r["flops"] / (r["tile_flops"] / r["padded_rows"])
        print(f"| {r['shape']} | {r['tokens']} | {r['routing']} | {r['ffn_ms']:.3f} | {r['ffn_floor_ms']:.3f} "
              f"| {r['tile_ffn_floor_ms']:.3f} | {r['padded_rows'] / rows:.2f} | {dense:.3f} "
              f"| {r['flops'] / dense / 1e9:.0f} | {r['flops'] / r['ffn_ms'] / 1e9:.0f} | {lc['mean_sm_mhz']:.0f} "
              f"| {lc['mean_watts']:.0f} | {dc['mean_sm_mhz']:.0f} | {reasons(lc)} |")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(*sys.argv[1:])
