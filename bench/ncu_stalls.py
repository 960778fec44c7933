#!/usr/bin/env python3
"""Where a kernel's warps wait, instruction by instruction, from ncu's source page.

    ncu --set full --import-source no -o REP -k regex:KERNEL BINARY ARGS...
    ncu -i REP.ncu-rep --page source --csv --print-source sass > REP.csv
    python3 bench/ncu_stalls.py REP.csv [--top 30] [--kernel 0]

For each kernel in the file: its sampled stall reasons summed, the instructions grouped by how
many times they ran (a loop body runs as often as its trip count: the consumer's per-step code, a
producer's per-copy loop, an epilogue stand apart), and the instructions with the most samples,
each with its two largest reasons. This is how the wgmma GEMMs over decoded registers
(kernels/moe/moe_stream_wgmma.cu, PERF_NOTES.md) showed a consumer waiting on its own wgmma group
and a producer issuing one bulk copy in ~120 cycles.
"""
import argparse
import collections
import csv
import sys


def read_kernels(path):
    kernels, header = [], None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if row and row[0] == "Kernel Name":
                kernels.append((row[1] if len(row) > 1 else "?", []))
                header = None
            elif kernels and header is None:
                header = row
            elif kernels and header and len(row) == len(header):
                kernels[-1][1].append(dict(zip(header, row)))
    return kernels


def number(text):
    try:
        return int(text.replace(",", ""))
    except ValueError:
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30, help="instructions to list")
    ap.add_argument("--kernel", type=int, default=-1, help="only this kernel (0 = the first in the file)")
    args = ap.parse_args()
    kernels = read_kernels(args.csv)
    if not kernels:
        sys.exit(f"ncu_stalls: no kernel in {args.csv} (was it written with --page source --csv?)")
    for k, (name, rows) in enumerate(kernels):
        if args.kernel >= 0 and k != args.kernel:
            continue
        reasons = [c for c in (rows[0] if rows else {}) if c.startswith("stall_") and "Not Issued" not in c]
        total = sum(number(r["# Samples"]) for r in rows)
        print(f"== kernel {k}: {name[:120]}\n   {len(rows)} instructions, {total} samples")
        sums = collections.Counter({c[6:]: sum(number(r[c]) for r in rows) for c in reasons})
        print("   reasons: " + ", ".join(f"{c} {v}" for c, v in sums.most_common() if v))
        # Samples no named reason holds (~10 % of the wgmma GEMMs', largest on their HGMMAs), and the
        # page's other sample columns, one of which holds them.
        named = sum(sums.values())
        if total > named:
            others = [c for c in (rows[0] if rows else {})
                      if ("ample" in c or "tall" in c) and c not in reasons and c != "# Samples"]
            print(f"   not in a named reason: {total - named} samples ({100.0 * (total - named) / max(total, 1):.1f} %);"
                  f" other sample columns: {', '.join(others) or 'none'}")
        groups = collections.defaultdict(lambda: [0, 0])
        for r in rows:
            g = groups[number(r["Instructions Executed"])]
            g[0] += 1
            g[1] += number(r["# Samples"])
        print("   by times executed (times: instructions, samples):")
        for times, (n, s) in sorted(groups.items(), key=lambda x: -x[1][1])[:8]:
            print(f"     {times:>10}: {n:5} instructions, {s:7} samples ({100.0 * s / max(total, 1):.1f} %)")
        print("   top instructions (samples, times executed, SASS, largest reasons):")
        for r in sorted(rows, key=lambda r: -number(r["# Samples"]))[: args.top]:
            top = sorted(((number(r[c]), c[6:]) for c in reasons if number(r[c])), reverse=True)[:2]
            why = ", ".join(f"{c} {v}" for v, c in top)
            rest = number(r["# Samples"]) - sum(number(r[c]) for c in reasons)
            if rest > 0:
                why += f", unnamed {rest}"
            print(f"     {number(r['# Samples']):6} {number(r['Instructions Executed']):9}  {r['Source'].strip()[:58]:58}  {why}")


if __name__ == "__main__":
    main()
