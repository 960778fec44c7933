#!/usr/bin/env python3
"""Each kernel launch's time, DRAM bytes and bandwidth, from ncu's CSV (issue 13's decode chain).

    ncu --cache-control none --clock-control none \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \\
        moeshard bench-model ... --layers 2 --prompt-len 32 --decode-steps 2 --streams 1 > RUN.csv
    python3 bench/ncu_kernels.py RUN.csv [--last N]

ncu runs the launches one after another (no PDL overlap), so their sum bounds the chain from
above; a kernel far below the copy rate with megabytes to read, or a one-block kernel taking tens
of µs, is where a decode step's time goes (docs/PERFORMANCE.md, eighteenth session: Muse Spark's
residual updates, ~90 µs of a ~441 µs layer). bench/decode_kernels.sh runs both shapes.
"""
import argparse
import collections
import csv
import sys

TIME = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
BYTES = {"byte": 1, "B": 1, "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6, "Gbyte": 1e9, "GB": 1e9}


def launches(path):
    with open(path, newline="") as f:
        rows = csv.reader(line for line in f if line.startswith('"'))
        header = next(rows, None)
        if not header or "Metric Name" not in header:
            sys.exit(f"ncu_kernels: no ncu CSV in {path} (was ncu run with --csv and --metrics?)")
        col = {h: i for i, h in enumerate(header)}
        out = collections.OrderedDict()
        for row in rows:
            if len(row) != len(header):
                continue
            d = out.setdefault(int(row[col["ID"]]), {"name": row[col["Kernel Name"]],
                                                     "grid": row[col["Grid Size"]] if "Grid Size" in col else "",
                                                     "us": 0.0, "bytes": 0.0})
            try:
                value = float(row[col["Metric Value"]].replace(",", ""))
            except ValueError:
                continue
            metric, unit = row[col["Metric Name"]], row[col["Metric Unit"]]
            if metric == "gpu__time_duration.sum":
                d["us"] = value * TIME.get(unit, 1.0)
            elif metric.startswith("dram__bytes"):
                d["bytes"] += value * BYTES.get(unit, 1.0)
    return list(out.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--last", type=int, default=40, help="the last N launches (a decode step's tail)")
    args = ap.parse_args()
    rows = launches(args.csv)[-args.last:]
    total_us = total_b = 0.0
    print(f"{'µs':>9} {'MB':>9} {'GB/s':>7} {'grid':>14}  kernel")
    for d in rows:
        total_us += d["us"]
        total_b += d["bytes"]
        rate = d["bytes"] / d["us"] / 1e3 if d["us"] > 0 else 0.0
        print(f"{d['us']:9.2f} {d['bytes'] / 1e6:9.2f} {rate:7.0f} {d['grid']:>14}  {d['name'][:90]}")
    if total_us > 0:
        print(f"{total_us:9.1f} {total_b / 1e6:9.1f} {total_b / total_us / 1e3:7.0f} {'':>14}  (sum of the {len(rows)} launches)")


if __name__ == "__main__":
    main()
