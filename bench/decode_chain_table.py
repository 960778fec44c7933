"""The table of bench/decode_chain.sh: DIR holds one bench-model output per op (OP.txt), `none`
the plain run. For every decode row ("| decode, N stream(s) | ... | X ms / step | ..."), each op's
step time and its difference from `none`, in µs a layer (the LM head's in µs a step)."""
import re
import sys


def steps(path):
    rows = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"\| decode, (\d+) streams? \|[^|]*\| ([0-9.]+) ms / step \|", line)
            if m:
                rows[int(m.group(1))] = float(m.group(2))
    return rows


def main():
    folder, layers, ops = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    got = {op: steps(f"{folder}/{op}.txt") for op in ops}
    streams = sorted(got["none"])
    if not streams:
        sys.exit("decode_chain: no decode rows in the plain run")
    head = "| op launched twice | " + " | ".join(f"{s} stream{'s' if s > 1 else ''}: ms a step | µs a layer" for s in streams)
    print(head + " |")
    print("|---" * (1 + 2 * len(streams)) + "|")
    for op in ops:
        cells = []
        for s in streams:
            t = got[op].get(s)
            if t is None:
                cells += ["-", "-"]
                continue
            d = (t - got["none"][s]) * 1000.0
            extra = "" if op == "none" else (f"{d:.0f} a step" if op == "lmhead" else f"{d / layers:.1f}")
            cells += [f"{t:.2f}", extra]
        print(f"| {op} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
