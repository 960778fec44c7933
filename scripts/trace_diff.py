#!/usr/bin/env python3
"""Compares two residual traces op by op (worker/model_runner.h ResidualTrace).

    MOESHARD_TRACE_POSITION=P moeshard check ... --dtype bfloat16 2> a.log
    MOESHARD_TRACE_POSITION=P moeshard check ... --dtype float32  2> b.log
    scripts/trace_diff.py a.log b.log

Each run prints one line per residual update of the row at position P ("moeshard trace:
position P layer L attention|mlp rank R/N: v0 v1 ..."). For every update both runs made (the
first occurrence of each position, layer, block and rank: a run's later steps with the same row
repeat it), prints the relative L2 difference |a - b| / |b|, the largest absolute difference and
where, and the growth over the update before: the op whose growth stands out is where the runs part.
Where both runs also printed an MoE layer's routing ("... route rank R/N: experts ... logits ..."),
the MLP row says whether their experts differ and B's router margin at the k-th pick (a near tie
when small).
"""
import math
import re
import sys

LINE = re.compile(r"moeshard trace: position (\d+) layer (\d+) (attention|mlp) rank (\d+)/(\d+):(.*)$")
ROUTE = re.compile(r"moeshard trace: position (\d+) layer (\d+) route rank (\d+)/(\d+): experts ([-\d ]*) logits(.*)$")


def read(path):
    """{(position, layer, block, rank): [floats]} in the order first seen, first occurrence only."""
    out = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.search(line.rstrip("\n"))
            if not m:
                continue
            key = (int(m.group(1)), int(m.group(2)), m.group(3), int(m.group(4)))
            if key not in out:
                out[key] = [float(v) for v in m.group(6).split()]
    return out


def read_routes(path):
    """{(position, layer, rank): (picked ids, router logits)}, first occurrence only."""
    out = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = ROUTE.search(line.rstrip("\n"))
            if not m:
                continue
            key = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            if key not in out:
                out[key] = ([int(v) for v in m.group(5).split()], [float(v) for v in m.group(6).split()])
    return out


def route_note(ra, rb):
    """For an MoE layer both runs routed: whether the picks differ, and B's margin at its k-th pick."""
    (ida, la), (idb, lb) = ra, rb
    k = len(idb)
    order = sorted(range(len(lb)), key=lambda e: -lb[e])
    margin = lb[order[k - 1]] - lb[order[k]] if len(lb) > k else math.inf
    if sorted(ida) == sorted(idb):
        return f"same experts (B's margin at pick {k}: {margin:.3g})"
    return (f"EXPERTS DIFFER: A only {sorted(set(ida) - set(idb))}, B only {sorted(set(idb) - set(ida))}; "
            f"B's margin between picks {k} and {k + 1}: {margin:.3g}")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: trace_diff.py A.log B.log")
    a, b = read(sys.argv[1]), read(sys.argv[2])
    keys = [k for k in a if k in b]
    if not keys:
        sys.exit("no residual update in both traces (MOESHARD_TRACE_POSITION set for both runs?)")
    print("| position | layer | block | rank | rel. L2 diff | max abs diff (index) | growth |")
    print("|---|---|---|---|---|---|---|")
    routes_a, routes_b = read_routes(sys.argv[1]), read_routes(sys.argv[2])
    prev = None
    for k in keys:
        x, y = a[k], b[k]
        if len(x) != len(y):
            sys.exit(f"{k}: widths differ ({len(x)} and {len(y)})")
        d = [p - q for p, q in zip(x, y)]
        norm_y = math.sqrt(sum(q * q for q in y))
        rel = math.sqrt(sum(v * v for v in d)) / norm_y if norm_y > 0 else math.inf
        i = max(range(len(d)), key=lambda j: abs(d[j]))
        growth = "" if prev in (None, 0.0) else f"{rel / prev:.2f}x"
        note = ""
        rk = (k[0], k[1], k[3])
        if k[2] == "mlp" and rk in routes_a and rk in routes_b:
            note = " " + route_note(routes_a[rk], routes_b[rk])
        print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {rel:.3e} | {abs(d[i]):.3e} ({i}) | {growth}{note} |")
        prev = rel


if __name__ == "__main__":
    main()
