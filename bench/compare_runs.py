#!/usr/bin/env python3
"""The same benchmarks from two builds of one device call, side by side: the no-regression table.

Usage: compare_runs.py BEFORE.json AFTER.json [--limit 1.03]
Reads cuda_layer_bench records ("kind": "layer": total_ms per shape, tokens, routing) and
tile_signal_bench records (layer_ms and bitwise per shape, tokens, ranks, variant), prints a
markdown table of after / before per case and a verdict line: how many cases are within the
limit (or faster), and whether every overlapped output was bitwise equal to sequential. Exit 0
always when both files were read: a timing is judged by the reader of the table, not by a test.
"""
import argparse
import json
import sys


def records(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                out.append(json.loads(line))
    return out


def keyed(rows):
    table = {}
    for r in rows:
        if r.get("kind") == "layer":
            table[("layer", r["shape"], r["tokens"], r["routing"])] = (r["total_ms"], None)
        elif "variant" in r:
            variant = r["variant"].split(" -> ")[0]  # auto's pick may differ; the case is the same
            table[("tile_signal", r["shape"], r["tokens"], r["ranks"], variant)] = (r["layer_ms"], r.get("bitwise"))
    return table


def main():
    parser = argparse.ArgumentParser(description="after / before per benchmark case of one device call")
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--limit", type=float, default=1.03, help="after / before counted as within (default 1.03)")
    args = parser.parse_args()
    limit = args.limit
    before, after = keyed(records(args.before)), keyed(records(args.after))
    print("| case | before ms | after ms | after / before | bitwise (after) |")
    print("|---|---|---|---|---|")
    within = compared = 0
    not_bitwise = []
    for key in sorted(set(before) & set(after), key=str):
        b, _ = before[key]
        a, bitwise = after[key]
        ratio = a / b if b > 0 else float("nan")
        compared += 1
        within += ratio <= limit
        if bitwise is False and "sequential" not in key[-1]:
            not_bitwise.append(key)
        flag = "" if ratio <= limit else " (over)"
        bits = "-" if bitwise is None else ("yes" if bitwise else "NO")
        print(f"| {' '.join(str(k) for k in key)} | {b:.3f} | {a:.3f} | {ratio:.3f}{flag} | {bits} |")
    missing = sorted(set(before) ^ set(after), key=str)
    print(f"\n{within} of {compared} cases within {limit:.2f}x of before or faster; "
          f"{len(not_bitwise)} overlapped outputs not bitwise equal to sequential; {len(missing)} cases in one run only")
    for key in missing:
        print("  only in " + ("before" if key in before else "after") + ": " + " ".join(str(k) for k in key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
