#!/usr/bin/env python3
"""Long-position goldens (issue 19): next-token top-20 logits and log-sum-exp at every position of
one long random sequence, from references this project did not write.

  qwen3moe-tiny   transformers' Qwen3MoeForCausalLM on the model's own safetensors (needs
                  transformers; the GPU machine has it): --short tokens (16,384, for the CPU check)
                  and --long tokens (131,072, for the GPU check).
  muse-spark-tiny ../shared/reference/muse_spark.py MuseSpark in float64: --short tokens.

Precision (docs/design/long-context.md, "Long goldens", has the measured figures):
  * Everything runs in float64. transformers' Qwen3 computes three things in float32 whatever the
    model's dtype: the RoPE angles (position x inv_freq), every RMSNorm, and the router softmax.
    The golden overrides the first two on the loaded model, in float64 with transformers' own
    formulas (rotary_emb.forward and each RMSNorm's forward, below); the router softmax stays
    (its float32 rounding, ~1e-7 relative, only matters at an exact near tie). The run measures
    what each override changes (transformers as shipped against the golden) and prints it.
  * Attention: at --short, torch's scaled_dot_product_attention with the math backend in float64
    (attn_implementation="sdpa"); its T x T scores do not fit at --long (4 heads x 128K^2 x 8 bytes
    = 550 GB), so there the same math backend runs on blocks of --chunk query rows (each row
    against the keys it may see: the result of each row is the same computation), registered as an
    attention backend through transformers' AttentionInterface. At --short both run and must agree
    to 1e-9, and a float32 model (transformers as shipped, no TF32) is measured
    against the golden too.
  * The logits are lm_head(final hidden state) of the float64 model; top-20 and lse in float64,
    stored as float32.

Output, in OUT_DIR: {model}-{16k,128k}.safetensors (keys seq0.ids, seq0.topk_ids,
seq0.topk_logits, seq0.lse: what `moeshard check` reads) and report.json (timings, measurements,
SHA-256 of each file). Prints timings as it goes.

Usage (GPU machine, from the repository root; ~2-3 minutes on an H200):
  python3 tests/testdata/make_long_goldens.py OUT_DIR [--reference DIR] [--testdata tests/testdata]
      [--models qwen3moe-tiny,muse-spark-tiny] [--short 16384] [--long 131072] [--device cuda]
      [--no-measure]   (--short 0: no short golden; --long 0: no long one)
Without a GPU (the muse path with Debian's python3-torch; transformers absent):
  /usr/bin/python3 tests/testdata/make_long_goldens.py OUT --models muse-spark-tiny --short 512 --device cpu
--reference defaults to ROOT/shared/reference, then ROOT/../shared/reference (muse_spark.py).
"""
import argparse
import contextlib
import hashlib
import json
import math
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPK = 20
SEEDS = {"qwen3moe-tiny": 1901, "muse-spark-tiny": 1902}
T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


def safetensors_io():
    try:
        from safetensors.torch import save_file, load_file
    except ImportError:  # this VM: the repository's minimal writer and reader (make_kv4.py)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from make_kv4 import save_file, load_file
    return save_file, load_file


def length_name(n):
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ------------------------------------------------------------------ goldens and comparisons
def golden_tensors(ids, logits):
    lg = logits.to(torch.float64)
    v, i = torch.topk(lg, TOPK, dim=-1)
    return {"seq0.ids": ids.to(torch.int32).cpu().contiguous(),
            "seq0.topk_ids": i.to(torch.int32).cpu().contiguous(),
            "seq0.topk_logits": v.to(torch.float32).cpu().contiguous(),
            "seq0.lse": torch.logsumexp(lg, -1).to(torch.float32).cpu().contiguous()}


def compare(golden_logits, other_logits):
    """What `moeshard check` measures at the fp32 tolerance, for `other` against the golden:
    max over positions of |other - golden| / max(1, |golden|) on the golden's top-20 ids, the
    same for the lse, top-1 agreement, and how many positions exceed 1e-3."""
    g = golden_logits.to(torch.float64)
    o = other_logits.to(torch.float64)
    gv, gi = torch.topk(g, TOPK, dim=-1)
    ov = torch.gather(o, 1, gi)
    err = ((ov - gv).abs() / gv.abs().clamp(min=1.0)).amax(-1)
    gl, ol = torch.logsumexp(g, -1), torch.logsumexp(o, -1)
    lerr = (ol - gl).abs() / gl.abs().clamp(min=1.0)
    pos_err = torch.maximum(err, lerr)
    worst = int(pos_err.argmax())
    return {"max_err": float(err.max()), "max_lse_err": float(lerr.max()),
            "median_err": float(pos_err.median()),
            "positions_over_1e-3": int((pos_err > 1e-3).sum()), "positions": int(g.shape[0]),
            "worst_position": worst,
            "top1": float((o.argmax(-1) == gi[:, 0]).double().mean())}


def fmt(c):
    return (f"max_err {c['max_err']:.3g} lse_err {c['max_lse_err']:.3g} median {c['median_err']:.3g} "
            f"over_1e-3 {c['positions_over_1e-3']}/{c['positions']} (worst at {c['worst_position']}) "
            f"top1 {100 * c['top1']:.2f}%")


# ------------------------------------------------------------------ qwen3moe-tiny (transformers)
def rope_theta_of(model_dir):
    c = json.load(open(os.path.join(model_dir, "config.json")))
    assert c.get("rope_scaling") in (None, {}) or c["rope_scaling"].get("rope_type") == "default", c["rope_scaling"]
    return float(c["rope_parameters"]["rope_theta"] if "rope_parameters" in c else c["rope_theta"])


def rotary_modules(model):
    """transformers' rotary embeddings: one on the model, or one per attention layer (some 4.5x)."""
    mods = [mod for mod in model.modules() if type(mod).__name__.endswith("RotaryEmbedding")]
    assert mods, "no rotary embedding module found"
    return mods


def override_rope64(model, theta):
    """transformers' default rotary embedding with the angles in float64: the same formula
    (inv_freq = theta^(-2i/d), angle = position x inv_freq, cos/sin of [angle, angle] times
    attention_scaling), computed in float64 instead of float32, cast to the activations' dtype.
    Returns the number of calls made so far (a list that grows), to prove it is the one used."""
    hd = model.config.head_dim
    dev = next(model.parameters()).device
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64, device=dev) / hd))
    calls = []
    for rot in rotary_modules(model):
        assert getattr(rot, "rope_type", "default") == "default", rot.rope_type
        scaling = float(getattr(rot, "attention_scaling", 1.0))

        def forward(x, position_ids=None, *args, scaling=scaling, **kwargs):
            calls.append(1)
            ang = position_ids.to(torch.float64)[..., None] * inv
            emb = torch.cat([ang, ang], -1)
            return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)

        rot.forward = forward
    return calls


def override_norm64(model):
    """Each RMSNorm as transformers writes it (x * rsqrt(mean(x^2) + eps) * weight) but in the
    activations' dtype: transformers' Qwen3 norm upcasts to float32 and back, which rounds a
    float64 model's activations to float32 at every norm."""
    n = 0
    for mod in model.modules():
        if type(mod).__name__.endswith("RMSNorm"):
            eps = float(getattr(mod, "variance_epsilon", getattr(mod, "eps", 1e-6)))

            def forward(x, mod=mod, eps=eps):
                return mod.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

            mod.forward = forward
            n += 1
    assert n > 0, "no RMSNorm module found"
    return n


def register_chunked_attention(chunk):
    """torch SDPA (math backend, the dtype of its inputs) over blocks of `chunk` query rows, each
    block against the keys it may see; registered as attn_implementation="sdpa_math_chunked"."""
    from transformers import AttentionInterface
    from torch.nn.attention import SDPBackend, sdpa_kernel
    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        AttentionMaskInterface.register("sdpa_math_chunked", sdpa_mask)
    except ImportError:
        pass

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        # query [B, Hq, T, D]; key, value [B, Hkv, S, D] (the new tokens are the last T of S).
        rep = query.shape[1] // key.shape[1]
        k = key.repeat_interleave(rep, dim=1)
        v = value.repeat_interleave(rep, dim=1)
        T, S = query.shape[2], key.shape[2]
        out = torch.empty_like(query)
        kpos = torch.arange(S, device=query.device)
        with sdpa_kernel([SDPBackend.MATH]):
            for a in range(0, T, chunk):
                b = min(T, a + chunk)
                visible = S - T + b  # keys past the block's last query are masked for all its rows
                qpos = torch.arange(S - T + a, S - T + b, device=query.device)
                mask = kpos[None, :visible] <= qpos[:, None]
                if attention_mask is not None:
                    m = attention_mask[..., a:b, :visible]
                    mask = mask & (m if m.dtype == torch.bool else m == 0)
                out[:, :, a:b] = torch.nn.functional.scaled_dot_product_attention(
                    query[:, :, a:b], k[:, :, :visible], v[:, :, :visible], attn_mask=mask, scale=scaling)
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register("sdpa_math_chunked", attention)
    return "sdpa_math_chunked"


def load_qwen(model_dir, dtype, attn, device):
    from transformers import Qwen3MoeForCausalLM
    kw = dict(dtype=dtype, attn_implementation=attn)
    try:  # transformers 5: the per-expert loop (grouped_mm has no float64 kernel)
        m = Qwen3MoeForCausalLM.from_pretrained(model_dir, experts_implementation="eager", **kw)
    except (TypeError, ValueError) as e:
        log("experts_implementation='eager' not accepted:", e)
        m = Qwen3MoeForCausalLM.from_pretrained(model_dir, **kw)
    if hasattr(m.config, "_experts_implementation"):  # what the experts' forward dispatches on
        m.config._experts_implementation = "eager"
    return m.to(device).eval()


def qwen_logits(m, ids):
    with torch.no_grad():
        h = m.model(input_ids=ids[None], use_cache=False).last_hidden_state
        return m.lm_head(h)[0]


class QwenRun:
    """One configuration of the reference: dtype, attention, and which float64 overrides."""

    def __init__(self, model_dir, device, dtype, attn, rope64, norm64):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        self.device, self.attn = device, attn
        self.m = load_qwen(model_dir, dtype, attn, device)
        # float64: SDPA's math backend (the only one with float64); float32: torch's own choice.
        self.backends = (lambda: sdpa_kernel([SDPBackend.MATH])) if dtype == torch.float64 else contextlib.nullcontext
        self.calls = None
        if rope64:
            self.calls = override_rope64(self.m, rope_theta_of(model_dir))
        if norm64:
            override_norm64(self.m)

    def __call__(self, ids):
        sync(self.device)
        t = time.time()
        with self.backends():
            lg = qwen_logits(self.m, ids)
        sync(self.device)
        if self.calls is not None:
            assert self.calls, "the float64 rotary embedding was not called"
        return lg.to(torch.float64), time.time() - t


def rope_angle_error(model_dir, device, n):
    """Largest |cos, sin| difference between transformers' float32 rotary tables and float64 ones
    at positions 0..n-1 (the RoPE error a float64 model gets from transformers as shipped)."""
    m = load_qwen(model_dir, torch.float64, "sdpa", device)
    pos = torch.arange(n, device=device)[None]
    x = torch.zeros(1, device=device, dtype=torch.float64)
    with torch.no_grad():
        c32, s32 = rotary_modules(m)[0](x, pos)
        override_rope64(m, rope_theta_of(model_dir))
        c64, s64 = rotary_modules(m)[0](x, pos)
    return max(float((c32 - c64).abs().max()), float((s32 - s64).abs().max()))


def build_qwen(a, model_dir, save, report):
    import transformers
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    chunked = register_chunked_attention(a.chunk)
    V = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
    g = torch.Generator().manual_seed(SEEDS["qwen3moe-tiny"])
    longest = max(a.short, a.long)
    all_ids = torch.randint(0, V, (longest,), generator=g).to(a.device)
    r = report.setdefault("qwen3moe-tiny", {"transformers": transformers.__version__, "torch": torch.__version__})

    if a.short:
        build_qwen_short(a, model_dir, save, r, all_ids[:a.short], chunked)
    if a.long:
        build_qwen_long(a, model_dir, save, r, all_ids[:a.long], chunked)


def build_qwen_short(a, model_dir, save, r, ids, chunked):
    """--short: the golden, and what each of its choices changes."""
    f64 = torch.float64
    gold, dt = QwenRun(model_dir, a.device, f64, "sdpa", True, True)(ids)
    log(f"qwen3moe-tiny {a.short}: float64 golden (SDPA math, RoPE and RMSNorm in float64) in {dt:.1f}s")
    save("qwen3moe-tiny", a.short, ids, gold, "transformers Qwen3MoeForCausalLM float64, SDPA math, "
         "RoPE and RMSNorm overridden to float64")
    variants = [
        ("chunked_attention", (f64, chunked, True, True), "float64 with the long recipe's chunked attention"),
        ("transformers_rope", (f64, "sdpa", False, True), "float64 with transformers' float32 RoPE angles"),
        ("transformers_norm", (f64, "sdpa", True, False), "float64 with transformers' float32 RMSNorm"),
        ("float32_shipped", (torch.float32, "sdpa", False, False),
         "float32, transformers as shipped (torch picks the SDPA backend; no TF32)"),
    ]
    for key, args, what in variants if a.measure else variants[:1]:
        other, dt = QwenRun(model_dir, a.device, *args)(ids)
        c = compare(gold, other)
        r[f"short_{key}"] = dict(c, what=what, seconds=dt)
        log(f"qwen3moe-tiny {a.short}: {what} vs golden: {fmt(c)} ({dt:.1f}s)")
    assert r["short_chunked_attention"]["max_err"] < 1e-9, "chunked attention is not the unchunked one"


def build_qwen_long(a, model_dir, save, r, ids, chunked):
    """--long: the golden (chunked attention), and what transformers' float32 RoPE and norm change."""
    f64 = torch.float64
    r["rope_table_max_diff"] = rope_angle_error(model_dir, a.device, a.long)
    log(f"qwen3moe-tiny: transformers' float32 cos/sin differ from float64 by up to "
        f"{r['rope_table_max_diff']:.3g} over positions < {a.long}")
    gold, dt = QwenRun(model_dir, a.device, f64, chunked, True, True)(ids)
    log(f"qwen3moe-tiny {a.long}: float64 golden (chunked SDPA math, RoPE and RMSNorm float64) in {dt:.1f}s")
    save("qwen3moe-tiny", a.long, ids, gold, f"transformers Qwen3MoeForCausalLM float64, SDPA math on "
         f"blocks of {a.chunk} queries, RoPE and RMSNorm overridden to float64")
    variants = [("transformers_rope", (f64, chunked, False, True), "float64 with transformers' float32 RoPE angles"),
                ("transformers_rope_norm", (f64, chunked, False, False),
                 "float64, transformers' float32 RoPE angles and RMSNorm")]
    for key, args, what in variants if a.measure else []:
        other, dt = QwenRun(model_dir, a.device, *args)(ids)
        c = compare(gold, other)
        r[f"long_{key}"] = dict(c, what=what, seconds=dt)
        log(f"qwen3moe-tiny {a.long}: {what} vs golden: {fmt(c)} ({dt:.1f}s)")
        del other


# ------------------------------------------------------------------ muse-spark-tiny (reference)
def build_muse(a, model_dir, save, report, load_file):
    sys.path.insert(0, a.reference)
    import muse_spark  # noqa: E402  (../shared/reference)
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    tensors = {k: v.to(a.device) for k, v in load_file(os.path.join(model_dir, "model.safetensors")).items()}
    ref = muse_spark.MuseSpark(cfg, tensors, torch.float64)
    g = torch.Generator().manual_seed(SEEDS["muse-spark-tiny"])
    ids = torch.randint(0, cfg["vocab_size"], (a.short,), generator=g).to(a.device)
    sync(a.device)
    t = time.time()
    with torch.no_grad():
        lg = ref.forward(ids)
    sync(a.device)
    dt = time.time() - t
    log(f"muse-spark-tiny {a.short}: muse_spark.MuseSpark float64 in {dt:.1f}s")
    report["muse-spark-tiny"] = {"seconds": dt, "torch": torch.__version__,
                                 "max_position_embeddings": cfg["max_position_embeddings"],
                                 "sliding_window": cfg["sliding_window"]}
    save("muse-spark-tiny", a.short, ids, lg, "../shared/reference/muse_spark.py MuseSpark float64")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--reference", help="folder holding muse_spark.py")
    ap.add_argument("--testdata", default=os.path.join(ROOT, "tests", "testdata"))
    ap.add_argument("--models", default="qwen3moe-tiny,muse-spark-tiny")
    ap.add_argument("--short", type=int, default=16384)
    ap.add_argument("--long", type=int, default=131072, help="qwen3moe-tiny only; 0: none")
    ap.add_argument("--chunk", type=int, default=2048, help="query rows per attention block at --long")
    ap.add_argument("--no-measure", dest="measure", action="store_false",
                    help="write the goldens only (no runs of the variants against them)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    if a.reference is None:
        for d in (os.path.join(ROOT, "shared", "reference"), os.path.join(ROOT, "..", "shared", "reference")):
            if os.path.exists(os.path.join(d, "muse_spark.py")):
                a.reference = d
                break
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    save_file, load_file = safetensors_io()
    report = {"command": " ".join(sys.argv), "device": a.device,
              "gpu": torch.cuda.get_device_name() if a.device.startswith("cuda") else None, "files": {}}

    def save(model, n, ids, logits, how):
        name = f"{model}-{length_name(n)}.safetensors"
        path = os.path.join(a.out, name)
        save_file(golden_tensors(ids, logits), path, metadata={"reference": how, "tokens": str(n),
                                                                "seed": str(SEEDS[model])})
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
        report["files"][name] = {"sha256": digest, "bytes": os.path.getsize(path), "reference": how}
        log(f"wrote {path} ({os.path.getsize(path)} bytes, sha256 {digest})")

    models = a.models.split(",")
    for model in models:
        model_dir = os.path.join(a.testdata, model)
        if model == "qwen3moe-tiny":
            build_qwen(a, model_dir, save, report)
        elif model == "muse-spark-tiny":
            if a.short == 0:
                raise SystemExit("muse-spark-tiny has only a --short golden: give --short N > 0")
            if a.reference is None:
                raise SystemExit("no muse_spark.py: give --reference (../shared/reference)")
            build_muse(a, model_dir, save, report, load_file)
        else:
            raise SystemExit(f"unknown model {model}")
    report["seconds"] = time.time() - T0
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    log(f"done in {report['seconds']:.1f}s; {os.path.join(a.out, 'report.json')}")


if __name__ == "__main__":
    main()
