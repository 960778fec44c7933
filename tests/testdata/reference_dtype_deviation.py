#!/usr/bin/env python3
"""How far the reference itself moves from a float64 long golden when it runs in a lower dtype:
the yardstick for `moeshard check --dtype bfloat16` at long positions (issue 19).

  python3 tests/testdata/reference_dtype_deviation.py GOLDEN.safetensors MODEL_DIR \
      [--dtype bfloat16,float32] [--tokens N] [--write-golden OUT.safetensors] [--reference DIR]
      [--device cuda] [--json OUT]

GOLDEN is a file of tests/testdata/long-goldens (keys seq0.ids, seq0.topk_ids, seq0.topk_logits,
seq0.lse); MODEL_DIR the model it was made from (muse-spark-tiny: ../shared/reference/muse_spark.py
MuseSpark, the reference the golden came from, run here in each --dtype on the golden's ids).
Prints, per dtype, what `moeshard check` measures on the same file: max error on the golden's
top-20 ids relative to max(1, |logit|), the lse error likewise, top-1 agreement and how many
positions exceed 1e-3, and the same per 1,024 positions. --tokens N compares the first N positions
only (a causal model's first N logits need only the first N ids) and --write-golden writes the
golden cut to those N positions, for `moeshard check` on the same positions. Needs PyTorch (the GPU
machine has it).
"""
import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def save(path, tensors):
    try:
        from safetensors.torch import save_file
    except ImportError:
        sys.path.insert(0, HERE)
        from make_kv4 import save_file
    save_file(tensors, path)


def load(path):
    try:
        from safetensors.torch import load_file
    except ImportError:
        sys.path.insert(0, HERE)
        from make_kv4 import load_file
    return load_file(path)


def measure(g, logits):
    """`moeshard check`'s measures of `logits` (T x V) against golden tensors `g`."""
    o = logits.to(torch.float64)
    gi = g["seq0.topk_ids"].to(o.device).long()
    gv = g["seq0.topk_logits"].to(o.device).double()
    gl = g["seq0.lse"].to(o.device).double()
    ov = torch.gather(o, 1, gi)
    err = ((ov - gv).abs() / gv.abs().clamp(min=1.0)).amax(-1)
    ol = torch.logsumexp(o, -1)
    lerr = (ol - gl).abs() / gl.abs().clamp(min=1.0)
    pos = torch.maximum(err, lerr)
    return {"max_err": float(err.max()), "max_lse_err": float(lerr.max()),
            "median_err": float(pos.median()), "worst_position": int(pos.argmax()),
            "positions_over_1e-3": int((pos > 1e-3).sum()), "positions": int(o.shape[0]),
            "top1": float((o.argmax(-1) == gi[:, 0]).double().mean())}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("golden")
    ap.add_argument("model")
    ap.add_argument("--dtype", default="bfloat16,float32")
    ap.add_argument("--tokens", type=int, default=0, help="the first N positions only (default all)")
    ap.add_argument("--write-golden", default=None, help="the golden cut to --tokens positions")
    ap.add_argument("--reference", default=None, help="folder holding muse_spark.py")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    ref_dir = a.reference
    if ref_dir is None:
        for d in (os.path.join(ROOT, "shared", "reference"), os.path.join(ROOT, "..", "shared", "reference")):
            if os.path.exists(os.path.join(d, "muse_spark.py")):
                ref_dir = d
                break
    if ref_dir is None:
        sys.exit("no muse_spark.py: pass --reference DIR")
    sys.path.insert(0, ref_dir)
    import muse_spark  # noqa: E402  (../shared/reference)

    g = load(a.golden)
    if a.tokens > 0:
        g = {k: v[:a.tokens].contiguous() for k, v in g.items()}
        if a.write_golden:
            save(a.write_golden, g)
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    if cfg.get("model_type") != "muse_spark":
        sys.exit(f"{a.model}: model_type {cfg.get('model_type')}; this script runs the muse_spark reference")
    raw = load(os.path.join(a.model, "model.safetensors"))
    ids = g["seq0.ids"].long().to(a.device)
    out = {}
    for name in a.dtype.split(","):
        dt = getattr(torch, name)
        ref = muse_spark.MuseSpark(cfg, {k: v.to(a.device) for k, v in raw.items()}, dt)
        t = time.time()
        with torch.no_grad():
            lg = ref.forward(ids)
        if a.device == "cuda":
            torch.cuda.synchronize()
        m = measure(g, lg)
        m["seconds"] = time.time() - t
        out[name] = m
        print(f"reference {name} vs the float64 golden ({os.path.basename(a.golden)}): max_err {m['max_err']:.3g} "
              f"lse_err {m['max_lse_err']:.3g} median {m['median_err']:.3g} over1e-3 {m['positions_over_1e-3']}/"
              f"{m['positions']} worst@{m['worst_position']} top1 {100 * m['top1']:.2f}% ({m['seconds']:.1f} s)",
              flush=True)
        step = 1024
        parts = [measure({k: v[i:i + step] for k, v in g.items()}, lg[i:i + step]) for i in range(0, lg.shape[0], step)]
        print("  per 1,024 positions, lse_err / top1:",
              " ".join(f"{q['max_lse_err']:.2g}/{100 * q['top1']:.0f}%" for q in parts), flush=True)
        del ref, lg
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
