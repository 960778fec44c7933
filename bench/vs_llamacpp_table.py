#!/usr/bin/env python3
"""The table of bench/vs_llamacpp.sh: moeshard and llama.cpp side by side, per expert variant.

    vs_llamacpp_table.py OUT_DIR

Reads OUT_DIR/serve-ENGINE-VARIANT.json and prefill-ENGINE-VARIANT.json (`moeshard bench serve
--json`), llama-bench-VARIANT.json (`llama-bench -o json`), bench-model-VARIANT.txt and
llama-batched-VARIANT.jsonl (`llama-batched-bench --output-format jsonl`: the engine-to-engine
decode rows, N sequences without HTTP), prints
one Markdown table per variant (ratio: how many times moeshard's speed llama.cpp's is; above 1,
moeshard is faster) and writes OUT_DIR/summary.json with the same figures.
"""
import json
import os
import re
import sys

ENGINES = ("moeshard", "llamacpp")


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def rows_for(out, variant):
    """(label, {engine: value}, higher_is_better, unit) rows for one variant."""
    serve = {e: load(os.path.join(out, f"serve-{e}-{variant}.json")) for e in ENGINES}
    prefill = {e: load(os.path.join(out, f"prefill-{e}-{variant}.json")) for e in ENGINES}
    rows = []
    levels = sorted({r["concurrency"] for s in serve.values() if s for r in s["runs"]})

    def run(e, n):
        s = serve[e]
        if not s:
            return None
        return next((r for r in s["runs"] if r["concurrency"] == n and r["successful"] > 0), None)

    for n in levels:
        got = {e: run(e, n) for e in ENGINES}
        if n == 1:
            # Time per output token ((e2e - TTFT) / (tokens - 1)) does not depend on how a
            # server groups tokens into writes; ITL p50 does (bursts make it near zero).
            rows.append(("1 stream: decode tok/s (1 / TPOT p50)",
                         {e: 1e3 / r["tpot"]["p50_ms"] for e, r in got.items() if r and r["tpot"]["p50_ms"] > 0},
                         True, "tok/s"))
            rows.append(("1 stream: inter-token latency p50",
                         {e: r["itl"]["p50_ms"] for e, r in got.items() if r}, False, "ms"))
        rows.append((f"{n} stream{'s' if n > 1 else ''}: output tok/s",
                     {e: r["output_tok_s"] for e, r in got.items() if r}, True, "tok/s"))
        failed = {e: r["failed"] for e, r in ((e, run_any(serve[e], n)) for e in ENGINES) if r and r["failed"]}
        if failed:
            rows.append((f"{n} stream{'s' if n > 1 else ''}: failed requests", failed, None, ""))
    pf = {e: p["runs"][0] for e, p in prefill.items() if p and p["runs"] and p["runs"][0]["successful"] > 0}
    if pf:
        n = (prefill["moeshard"] or prefill["llamacpp"])["prompt_len"]
        rows.append((f"{n}-token prefill: TTFT p50", {e: r["ttft"]["p50_ms"] for e, r in pf.items()}, False, "ms"))
    bench = load(os.path.join(out, f"llama-bench-{variant}.json"))
    for b in bench or []:
        kind = f"pp{b['n_prompt']}" if b.get("n_gen", 0) == 0 else f"tg{b['n_gen']}"
        rows.append((f"llama-bench {kind}", {"llamacpp": b["avg_ts"]}, True, "tok/s"))
    for key, mean in sorted(metric_means(out, variant).items()):
        label = key.replace("moeshard_", "").replace('{phase="', " ").replace('"}', "")
        rows.append((f"moeshard {label}: mean over the serve runs", {"moeshard": mean * 1e3}, None, "ms"))
    steps = bench_model_steps(out, variant)
    for n, (ms, bw) in sorted(steps.items()):
        rows.append((f"bench-model decode, {n} stream(s): step ({bw} % of copy BW)", {"moeshard": ms}, False, "ms"))
    batched = llama_batched(out, variant)
    for n in sorted(set(steps) | set(batched)):
        vals = {}
        if n in steps:
            vals["moeshard"] = n * 1e3 / steps[n][0]
        if n in batched:
            vals["llamacpp"] = batched[n]
        rows.append((f"{n} stream{'s' if n > 1 else ''}, engine to engine (bench-model / llama-batched-bench): "
                     "decode tok/s", vals, True, "tok/s"))
    return rows


def lines_of(path):
    """The file's lines; none when it is missing."""
    try:
        with open(path) as f:
            return f.read().splitlines()
    except OSError:
        return []


def bench_model_steps(out, variant):
    """{streams: (ms a decode step, % of copy BW)} from bench-model-VARIANT.txt."""
    steps = {}
    for line in lines_of(os.path.join(out, f"bench-model-{variant}.txt")):
        m = re.match(r"\|\s*decode, (\d+) streams?\s*\|[^|]*\|\s*([\d.]+) ms / step.*\(([\d.]+)% of copy BW\)", line)
        if m:
            steps[int(m.group(1))] = (float(m.group(2)), m.group(3))
    return steps


def llama_batched(out, variant):
    """{sequences: decode tok/s over all of them (S_TG)} from llama-batched-VARIANT.jsonl."""
    speeds = {}
    for line in lines_of(os.path.join(out, f"llama-batched-{variant}.jsonl")):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and "pl" in r and "speed_tg" in r:
            speeds[int(r["pl"])] = float(r["speed_tg"])
    return speeds


LONG_ENGINES = ("moeshard", "moeshard_fp8", "moeshard_auto", "moeshard_float32", "llamacpp", "llamacpp_q8_0")
LONG_NAMES = {"moeshard": "moeshard (bf16 KV)", "moeshard_fp8": "moeshard (FP8 KV)", "moeshard_float32": "moeshard (fp32 KV)",
              "moeshard_auto": "moeshard (default KV)",
              "llamacpp": "llama.cpp (f16 KV)", "llamacpp_q8_0": "llama.cpp (q8_0 KV)"}
# Ratios: moeshard over llama.cpp's default cache; moeshard's FP8 cache over llama.cpp's 8-bit one.
LONG_PAIRS = (("moeshard", "llamacpp"), ("moeshard_fp8", "llamacpp"), ("moeshard_fp8", "llamacpp_q8_0"))


def long_table(out, variant):
    """Rows (label, {engine: value}, higher_is_better, unit) of the --long runs: per prompt length
    the TTFT, prefill tok/s and decode tok/s (1 / TPOT p50) of one request."""
    found = {}
    for f in os.listdir(out):
        m = re.match(rf"long-(\w+?)-{variant}-(\d+)\.json$", f)
        if m and m.group(1) in LONG_ENGINES:
            j = load(os.path.join(out, f))
            r = j["runs"][0] if j and j.get("runs") else None
            found.setdefault(int(m.group(2)), {})[m.group(1)] = r
    rows = []
    for L in sorted(found):
        ok = {e: r for e, r in found[L].items() if r and r["successful"] > 0}
        rows.append((f"{L}-token prompt: TTFT", {e: r["ttft"]["p50_ms"] for e, r in ok.items()}, False, "ms"))
        rows.append((f"{L}-token prompt: prefill tok/s", {e: L * 1e3 / r["ttft"]["p50_ms"] for e, r in ok.items()
                                                         if r["ttft"]["p50_ms"] > 0}, True, "tok/s"))
        rows.append((f"{L}-token context: decode tok/s (1 / TPOT)", {e: 1e3 / r["tpot"]["p50_ms"] for e, r in ok.items()
                                                                    if r["tpot"]["p50_ms"] > 0}, True, "tok/s"))
        bad = {e: r["failed"] if r else "no result" for e, r in found[L].items() if not r or r["successful"] == 0}
        if bad:
            rows.append((f"{L}-token prompt: failed", bad, None, ""))
    return rows


def print_long(out, variant, summary):
    rows = long_table(out, variant)
    if not rows:
        return
    engines = [e for e in LONG_ENGINES if any(e in v for _, v, _, _ in rows)]
    pairs = [p for p in LONG_PAIRS if p[0] in engines and p[1] in engines]
    print(f"\n### long prompts, experts {variant.upper()} (one sequence)\n")
    print("| | " + " | ".join(LONG_NAMES[e] for e in engines) + "".join(
        f" | {LONG_NAMES[a]} / {LONG_NAMES[b]}" for a, b in pairs) + " |")
    print("|---" * (1 + len(engines) + len(pairs)) + "|")
    for label, vals, higher, unit in rows:
        cells = ["-" if vals.get(e) is None else (f"{vals[e]:.2f} {unit}" if unit else str(vals[e])) for e in engines]
        ratios = {}
        for a, b in pairs:
            x, y = vals.get(a), vals.get(b)
            ratios[f"{a}/{b}"] = None if higher is None or not x or not y else (x / y if higher else y / x)
        print(f"| {label} | " + " | ".join(cells) + "".join(
            f" | {'-' if r is None else f'{r:.2f}x'}" for r in ratios.values()) + " |")
        summary.setdefault(f"{variant}-long", []).append({"row": label, "unit": unit, **{e: vals.get(e) for e in engines},
                                                          "ratios": ratios})


def metric_means(out, variant):
    """Mean seconds of moeshard's step histograms over its serve runs (all concurrency levels and the
    prefill together): the coordinator's whole step and the worker's phases."""
    sums, counts = {}, {}
    for f in sorted(os.listdir(out)):
        if not re.match(rf"metrics-bench-moeshard-{variant}-\d+\.txt$", f):
            continue
        with open(os.path.join(out, f)) as fh:
            for line in fh:
                m = re.match(r'(\w+?)_(sum|count)(\{[^}]*\})? ([0-9.eE+-]+)$', line.strip())
                if not m or not m.group(1).endswith("step_seconds"):
                    continue
                key = m.group(1) + (m.group(3) or "")
                (sums if m.group(2) == "sum" else counts)[key] = float(m.group(4))
    return {k: sums[k] / counts[k] for k in sums if counts.get(k)}


def run_any(s, n):
    if not s:
        return None
    return next((r for r in s["runs"] if r["concurrency"] == n), None)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: vs_llamacpp_table.py OUT_DIR")
    out = sys.argv[1]
    variants = sorted({m.group(1) or m.group(2) for f in os.listdir(out)
                       for m in [re.match(r"(?:(?:serve|prefill|long)-\w+?-(mxfp4|q8_0)(?:-\d+)?\.json|"
                                       r"(?:bench-model|llama-batched)-(mxfp4|q8_0)\.(?:txt|jsonl))$", f)] if m}
                      - {None})
    summary = {}
    for v in variants:
        rows = rows_for(out, v)
        summary[v] = []
        if rows:
            print(f"\n### experts {v.upper()}, every other matrix Q8_0\n")
            print("| | moeshard | llama.cpp | moeshard / llama.cpp (speed) |")
            print("|---|---|---|---|")
        for label, vals, higher, unit in rows:
            m, l = vals.get("moeshard"), vals.get("llamacpp")
            ratio = None
            if higher is not None and m and l:
                ratio = m / l if higher else l / m
            cell = lambda x: "-" if x is None else (f"{x:.2f} {unit}" if unit else str(x))
            print(f"| {label} | {cell(m)} | {cell(l)} | {'-' if ratio is None else f'{ratio:.2f}x'} |")
            summary[v].append({"row": label, "unit": unit, "moeshard": m, "llamacpp": l, "ratio": ratio})
        print_long(out, v, summary)
    if not variants:
        print("no results in", out)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
