#!/usr/bin/env python3
"""Trains the bundled demo model (models/muse-spark-demo): a small Muse Spark on the King James Bible.

The model is the architecture of shared/docs/muse-spark.md, written here in batched form for training
and checked against the reference (shared/reference/muse_spark.py, class MuseSpark) in float64 on random
weights before any training step. The export holds the spec's tensor names, the experts in NVFP4
(muse_spark.nvfp4_quant), the router in fp32 and everything else in bf16; the goldens are computed by
the reference in float64 on the exported (dequantized) weights, so an fp32 engine matches them to
rounding.

Run on a GPU machine with PyTorch, tokenizers, safetensors (matplotlib for the loss curve):
    python3 tools/train_demo/train.py --corpus kjv.txt --reference-dir ../shared/reference --out OUTDIR
The corpus is plain text; tools/train_demo/make_corpus.sh makes it from Debian's bible-kjv package.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

QWEN2_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
               "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BYTE_LEVEL = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}

ms = None  # the reference module, imported in main()


def log(*a):
    print(*a, flush=True)


# ----------------------------------------------------------------------------------------------
# Tokenizer


def train_tokenizer(text_lines, vocab_size):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text_lines, trainer)
    # Make the JSON the same shape as Qwen2/3's tokenizer.json (which the engine reads).
    j = json.loads(tok.to_str())
    j["normalizer"] = {"type": "NFC"}
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
        dict(type="ByteLevel", **BYTE_LEVEL)]}
    j["post_processor"] = dict(type="ByteLevel", **BYTE_LEVEL)
    j["decoder"] = dict(type="ByteLevel", **BYTE_LEVEL)
    return Tokenizer.from_str(json.dumps(j)), j


# ----------------------------------------------------------------------------------------------
# The model, batched


def rms(x, eps):
    x = x if x.dtype == torch.float64 else x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope_tables(T, hd, theta, dtype, device):
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64, device=device) / hd))
    ang = torch.arange(T, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(dtype)
    return cos, sin


def apply_rope(x, cos, sin):
    # x: [B, T, h, hd]
    hd = x.shape[-1]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    rot = torch.cat([-x2, x1], -1)
    return x * cos[None, :, None, :] + rot * sin[None, :, None, :]


class Spark(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = c = cfg
        H, V = c["hidden_size"], c["vocab_size"]
        nq, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        L, I, E = c["moe_latent_size"], c["expert_intermediate_size"], c["num_experts"]

        def lin(o, i, std=None):
            return nn.Parameter(torch.randn(o, i) * (std if std is not None else 1.0 / math.sqrt(i)))

        def vec(n, v):
            return nn.Parameter(torch.full((n,), float(v)))

        self.embed = nn.Parameter(torch.randn(V, H))
        self.norm = vec(H, 1.0)
        self.lm_head = lin(V, H)
        self.layers = nn.ModuleList()
        for _ in range(c["num_hidden_layers"]):
            m = nn.Module()
            m.attn_norm = vec(H, 1.0)
            m.q = lin(nq * hd, H)
            m.k = lin(nkv * hd, H)
            m.v = lin(nkv * hd, H)
            m.gate = lin(nq, H)
            m.o = lin(H, nq * hd)
            m.attn_out_norm = vec(H, 1.0)
            m.attn_alpha = vec(H, 1.0)
            m.attn_beta = vec(H, 0.5)
            m.moe_norm = vec(H, 1.0)
            m.router = lin(E, H, 0.02)
            m.latent_in = lin(L, H)
            m.latent_out = lin(H, L)
            m.moe_out_norm = vec(H, 1.0)
            m.moe_alpha = vec(H, 1.0)
            m.moe_beta = vec(H, 0.5)
            m.eg = nn.Parameter(torch.randn(E, I, L) / math.sqrt(L))
            m.eu = nn.Parameter(torch.randn(E, I, L) / math.sqrt(L))
            m.ed = nn.Parameter(torch.randn(E, L, I) / math.sqrt(I))
            self.layers.append(m)

    # spec name <-> parameter
    def spec_items(self):
        yield "model.embed_tokens.weight", self.embed, None
        yield "model.norm.weight", self.norm, None
        yield "lm_head.weight", self.lm_head, None
        names = [("attn_norm.weight", "attn_norm"), ("self_attn.q_proj.weight", "q"), ("self_attn.k_proj.weight", "k"),
                 ("self_attn.v_proj.weight", "v"), ("self_attn.gate_proj.weight", "gate"), ("self_attn.o_proj.weight", "o"),
                 ("attn_out_norm.weight", "attn_out_norm"), ("attn_residual.alpha", "attn_alpha"),
                 ("attn_residual.beta", "attn_beta"), ("moe_norm.weight", "moe_norm"), ("mlp.router.weight", "router"),
                 ("mlp.latent_in.weight", "latent_in"), ("mlp.latent_out.weight", "latent_out"),
                 ("moe_out_norm.weight", "moe_out_norm"), ("moe_residual.alpha", "moe_alpha"),
                 ("moe_residual.beta", "moe_beta")]
        for i, m in enumerate(self.layers):
            p = f"model.layers.{i}."
            for spec, attr in names:
                yield p + spec, getattr(m, attr), None
            for e in range(self.cfg["num_experts"]):
                ep = p + f"mlp.experts.{e}."
                yield ep + "gate_proj.weight", m.eg, e
                yield ep + "up_proj.weight", m.eu, e
                yield ep + "down_proj.weight", m.ed, e

    def to_spec(self):
        return {n: (p[e] if e is not None else p).detach().clone() for n, p, e in self.spec_items()}

    @torch.no_grad()
    def from_spec(self, t):
        for n, p, e in self.spec_items():
            (p[e] if e is not None else p).copy_(t[n].to(p.dtype))

    def forward(self, ids, want_aux=False):
        c = self.cfg
        eps = c["rms_norm_eps"]
        B, T = ids.shape
        nq, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        E, K = c["num_experts"], c["num_experts_per_tok"]
        dt = self.embed.dtype
        cos, sin = rope_tables(T, hd, c["rope_theta"], dt, ids.device)
        pos = torch.arange(T, device=ids.device)
        causal = pos[None, :] <= pos[:, None]
        sliding = causal & (pos[:, None] - pos[None, :] < c["sliding_window"])
        s = self.embed[ids]
        aux = 0.0
        for i, m in enumerate(self.layers):
            full = c["layer_types"][i] == "full_attention"
            x = rms(s, eps) * m.attn_norm
            q = (x @ m.q.T).view(B, T, nq, hd)
            k = (x @ m.k.T).view(B, T, nkv, hd)
            v = (x @ m.v.T).view(B, T, nkv, hd)
            if not full:
                q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            k = k.repeat_interleave(nq // nkv, dim=1)
            v = v.repeat_interleave(nq // nkv, dim=1)
            o = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=causal if full else sliding)
            o = o.transpose(1, 2)  # [B, T, nq, hd]
            g = torch.sigmoid(x @ m.gate.T)
            o = (o * g[..., None].to(o.dtype)).reshape(B, T, nq * hd)
            a = o @ m.o.T
            s = m.attn_alpha * s + m.attn_beta * (rms(a, eps) * m.attn_out_norm)

            y = rms(s, eps) * m.moe_norm
            N = B * T
            yf = y.reshape(N, -1)
            rdt = torch.float64 if dt == torch.float64 else torch.float32
            with torch.autocast(device_type=ids.device.type, enabled=False):
                rl = yf.to(rdt) @ m.router.to(rdt).T  # [N, E]
            top_v, top_i = torch.topk(rl, K, dim=-1)
            top_w = torch.softmax(top_v, -1)
            z = yf @ m.latent_in.T  # [N, L]
            Lz = z.shape[-1]
            I = m.eg.shape[1]
            hg = (z @ m.eg.reshape(E * I, Lz).T).view(N, E, I)
            hu = (z @ m.eu.reshape(E * I, Lz).T).view(N, E, I)
            u = F.silu(hg) * hu
            d = torch.bmm(u.transpose(0, 1), m.ed.transpose(1, 2).to(u.dtype))  # [E, N, L]
            d = rms(d, eps)
            wfull = torch.zeros(N, E, dtype=d.dtype, device=d.device).scatter(1, top_i, top_w.to(d.dtype))
            comb = torch.einsum("ne,enl->nl", wfull, d)
            f = (comb @ m.latent_out.T).view(B, T, -1)
            s = m.moe_alpha * s + m.moe_beta * (rms(f, eps) * m.moe_out_norm)
            if want_aux:
                probs = torch.softmax(rl.float(), -1).mean(0)
                frac = torch.zeros(E, device=ids.device).scatter_add(0, top_i.reshape(-1), torch.ones(N * K, device=ids.device)) / (N * K)
                aux = aux + E * (frac * probs).sum()
        h = rms(s, eps) * self.norm
        logits = h @ self.lm_head.T
        return (logits, aux) if want_aux else logits


def validate_against_reference(cfg):
    """Random weights (perturbed so nothing is symmetric), float64, batched model vs muse_spark.MuseSpark."""
    torch.manual_seed(1234)
    m = Spark(cfg).double()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
            else:
                p.mul_(1.0 + 0.1 * torch.randn_like(p))
            # a router big enough that top-k choices are spread out
        for l in m.layers:
            l.router.mul_(50.0)
    T = cfg["sliding_window"] + 40
    ids = torch.randint(0, cfg["vocab_size"], (2, T))
    mine = m(ids)
    ref = ms.MuseSpark(cfg, m.to_spec(), dtype=torch.float64)
    worst = 0.0
    for b in range(2):
        r = ref.forward(ids[b])
        worst = max(worst, (mine[b] - r).abs().max().item())
    scale = mine.abs().max().item()
    log(f"validate: batched model vs reference MuseSpark, float64, T={T}: max |logit diff| = {worst:.3e} (logits up to {scale:.1f})")
    if not worst < 1e-9 * max(1.0, scale):
        raise SystemExit("validation FAILED: the batched model does not match the reference")


# ----------------------------------------------------------------------------------------------
# Data


def load_corpus(path, tok, val_every):
    text = open(path, encoding="utf-8").read()
    chapters = [ch.strip("\n") + "\n\n" for ch in text.split("\n\n") if ch.strip()]
    train_ch = [c for i, c in enumerate(chapters) if i % val_every != 7]
    val_ch = [c for i, c in enumerate(chapters) if i % val_every == 7]

    def enc(chs):
        out = []
        for e in tok.encode_batch(chs):
            out.extend(e.ids)
        return torch.tensor(out, dtype=torch.long)

    return enc(train_ch), enc(val_ch), len(chapters), len(val_ch)


@torch.no_grad()
def eval_loss(model, val, T, bs, dev):
    n = (len(val) - 1) // T
    xs = val[: n * T].view(n, T)
    ys = val[1: n * T + 1].view(n, T)
    tot, cnt = 0.0, 0
    for i in range(0, n, bs):
        x, y = xs[i:i + bs].to(dev), ys[i:i + bs].to(dev)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            lg = model(x)
        tot += F.cross_entropy(lg.float().reshape(-1, lg.shape[-1]), y.reshape(-1), reduction="sum").item()
        cnt += y.numel()
    return tot / cnt


# ----------------------------------------------------------------------------------------------
# Export


def export_tensors(model):
    t = {}
    for name, v in model.to_spec().items():
        v = v.float().cpu()
        if ".mlp.experts." in name:
            packed, scale, scale2 = ms.nvfp4_quant(v)
            t[name] = packed
            t[name + "_scale"] = scale
            t[name + "_scale_2"] = scale2.reshape(())
        elif name.endswith("mlp.router.weight"):
            t[name] = v.contiguous()
        else:
            t[name] = v.to(torch.bfloat16).contiguous()
    return t


def dequantized(t):
    out = {}
    for name, v in t.items():
        if name.endswith("_scale") or name.endswith("_scale_2"):
            continue
        if name + "_scale" in t:
            v = ms.nvfp4_dequant(v, t[name + "_scale"], t[name + "_scale_2"])
        out[name] = v.to(torch.float32)
    return out


def make_goldens(cfg, tensors, val, tok, prompts, gen_len, seq_lens, full_seqs=1, topk=20):
    """The first `full_seqs` sequences keep full float32 logits (KL against the engine); the others
    keep the top-`topk` logits of each position and its logsumexp, to keep the model folder small
    (tools/train_demo/trim_goldens.py narrows an older file the same way)."""
    ref = ms.MuseSpark(cfg, tensors, dtype=torch.float64)
    g = {}
    off = 0
    for k, T in enumerate(seq_lens):
        ids = val[off: off + T]
        off += T + 17
        lg = ref.forward(ids)
        lg32 = lg.to(torch.float32).contiguous()
        g[f"seq{k}.ids"] = ids.to(torch.int32).contiguous()
        if k < full_seqs:
            g[f"seq{k}.logits"] = lg32
        else:
            values, index = torch.topk(lg32, topk, dim=-1)
            g[f"seq{k}.topk_ids"] = index.to(torch.int32).contiguous()
            g[f"seq{k}.topk_logits"] = values.contiguous()
        g[f"seq{k}.lse"] = torch.logsumexp(lg, -1).to(torch.float32).contiguous()
    samples = []
    for k, p in enumerate(prompts):
        ids = tok.encode(p).ids
        cur = list(ids)
        margins = []
        for _ in range(gen_len):
            lg = ref.forward(torch.tensor(cur))[-1]
            top2 = torch.topk(lg, 2).values
            margins.append((top2[0] - top2[1]).item())
            cur.append(int(lg.argmax()))
        new = cur[len(ids):]
        g[f"gen{k}.prompt"] = torch.tensor(ids, dtype=torch.int32)
        g[f"gen{k}.greedy"] = torch.tensor(new, dtype=torch.int32)
        text = tok.decode(new)
        samples.append((p, text))
        log(f"gen{k}: {p!r} -> {text!r}  (smallest top-2 logit margin {min(margins):.2e})")
    return g, samples


# ----------------------------------------------------------------------------------------------


def main():
    global ms
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--reference-dir", required=True, help="folder holding muse_spark.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", help="reuse this tokenizer.json instead of training one")
    ap.add_argument("--train-seconds", type=float, default=270)
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--aux", type=float, default=0.01)
    ap.add_argument("--eval-every", type=int, default=150)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sys.path.insert(0, args.reference_dir)
    import muse_spark
    ms = muse_spark
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()

    cfg = ms.config(vocab_size=args.vocab, hidden_size=256, num_hidden_layers=6, num_attention_heads=8,
                    num_key_value_heads=2, head_dim=32, sliding_window=64, rope_theta=10000.0, num_experts=16,
                    num_experts_per_tok=2, moe_latent_size=128, expert_intermediate_size=128,
                    max_position_embeddings=4096)

    validate_against_reference(cfg)

    from tokenizers import Tokenizer
    if args.tokenizer:
        tok = Tokenizer.from_file(args.tokenizer)
        tj = json.load(open(args.tokenizer))
    else:
        lines = open(args.corpus, encoding="utf-8").read().split("\n")
        tok, tj = train_tokenizer([l + "\n" for l in lines], args.vocab)
    assert tok.get_vocab_size() <= args.vocab, tok.get_vocab_size()
    eos = tok.token_to_id("<|endoftext|>")
    im_end = tok.token_to_id("<|im_end|>")
    log(f"tokenizer: {tok.get_vocab_size()} tokens; eos {eos}; 'In the beginning God' -> {tok.encode('In the beginning God').tokens}")
    with open(os.path.join(args.out, "tokenizer.json"), "w") as f:
        json.dump(tj, f, ensure_ascii=False)

    train, val, nch, nval = load_corpus(args.corpus, tok, 50)
    log(f"corpus: {nch} chapters, {len(train)} train tokens, {len(val)} validation tokens ({nval} chapters held out, "
        f"{100.0 * len(val) / (len(val) + len(train)):.1f}%)")

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(args.seed)
    model = Spark(cfg).to(dev)
    nparam = sum(p.numel() for p in model.parameters())
    log(f"model: {nparam / 1e6:.2f}M parameters on {dev}")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=dev.type == "cuda")
    train_dev = train.to(dev)
    T, B = args.ctx, args.batch
    curve, vcurve = [], []
    best = (float("inf"), None, 0)
    step, t0, ema = 0, time.time(), None
    warm = 100
    while step < args.max_steps:
        el = time.time() - t0
        if el > args.train_seconds:
            break
        frac = el / args.train_seconds
        lr = args.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
        for gp in opt.param_groups:
            gp["lr"] = lr
        ix = torch.randint(0, len(train_dev) - T - 1, (B,), device=dev)
        x = torch.stack([train_dev[i:i + T] for i in ix])
        y = torch.stack([train_dev[i + 1:i + T + 1] for i in ix])
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            lg, aux = model(x, want_aux=True)
        loss = F.cross_entropy(lg.float().reshape(-1, lg.shape[-1]), y.reshape(-1))
        tot = loss + args.aux * aux / cfg["num_hidden_layers"]
        opt.zero_grad(set_to_none=True)
        tot.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        li = loss.item() if step % 10 == 0 or step == 1 else None
        if li is not None:
            ema = li if ema is None else 0.9 * ema + 0.1 * li
            curve.append((step, li))
        if step % args.eval_every == 0:
            model.eval()
            vl = eval_loss(model, val, T, 64, dev)
            model.train()
            vcurve.append((step, vl))
            log(f"step {step} ({time.time() - t0:.0f}s) lr {lr:.2e} train {ema:.3f} val {vl:.3f}")
            if vl < best[0]:
                best = (vl, {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, step)
    train_time = time.time() - t0
    model.eval()
    vl = eval_loss(model, val, T, 64, dev)
    vcurve.append((step, vl))
    log(f"end: {step} steps in {train_time:.0f}s, {step * B * T / train_time / 1e3:.0f}K tokens/s, val {vl:.4f}")
    if vl < best[0]:
        best = (vl, {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, step)
    model.load_state_dict(best[1])
    log(f"keeping the weights of step {best[2]}: val {best[0]:.4f}")

    # Export
    t = export_tensors(model)
    from safetensors.torch import save_file
    save_file(t, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    deq = dequantized(t)
    model.float().from_spec(deq)
    vl_export = eval_loss(model, val, T, 64, dev)
    log(f"exported weights (bf16, NVFP4 experts): val loss {vl_export:.4f} (ppl {math.exp(vl_export):.2f})")

    out_cfg = dict(cfg)
    out_cfg["quantization_config"] = {"quant_method": "nvfp4", "group_size": 16,
                                      "modules": "mlp.experts.*.{gate,up,down}_proj"}
    out_cfg["bos_token_id"] = eos
    out_cfg["eos_token_id"] = eos
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(out_cfg, f, indent=2)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": eos, "eos_token_id": [eos, im_end], "do_sample": False}, f, indent=2)

    # Goldens: the reference in float64 on the exported weights.
    prompts = ["In the beginning", "And Jesus said unto them,", "The LORD is my shepherd;"]
    gt = time.time()
    seq_lens = [24, 100]
    g, samples = make_goldens(out_cfg, t, val, tok, prompts, 24, seq_lens)
    save_file(g, os.path.join(args.out, "goldens.safetensors"))
    log(f"goldens: {time.time() - gt:.0f}s")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        ax.plot([a for a, _ in curve], [b for _, b in curve], lw=0.8, label="train (batch loss)")
        ax.plot([a for a, _ in vcurve], [b for _, b in vcurve], "o-", ms=3, label="validation (2% held out)")
        ax.set_xlabel("step (%d x %d tokens)" % (B, T))
        ax.set_ylabel("cross-entropy (nats/token)")
        ax.set_ylim(bottom=max(0.0, min(b for _, b in curve + vcurve) - 0.3), top=min(8.5, max(b for _, b in curve)))
        ax.grid(alpha=0.3)
        ax.legend()
        ax.set_title("muse-spark-demo on the King James Bible")
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "loss.png"))
    except Exception as e:  # noqa: BLE001
        log(f"no loss plot: {e}")

    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    card = f"""# muse-spark-demo

A small Muse Spark model (the architecture of `shared/docs/muse-spark.md` at toy width)
trained on the King James Bible, bundled so that moeshard has a model that writes real English. Made by
`tools/train_demo/train.py`; the goldens in `goldens.safetensors` come from the reference implementation
(`shared/reference/muse_spark.py`) in float64 on these exact (exported, dequantized) weights, rounded to
float32: seq0, the first {seq_lens[0]} tokens of the held-out chapters, with full logits (`seq0.logits`); seq1,
{seq_lens[1]} held-out tokens further on, with the top-20 logits and the logsumexp of every position;
gen0-{len(prompts) - 1}, the greedy continuations below. CI checks the engine against them: `moeshard check`
(fp32 tolerance; ctest `demo_model_check`) and KL(PyTorch || engine) on seq0, mean at most 1e-3
(ctest `demo_model_kl_test`).

| | |
|---|---|
| layers | {cfg['num_hidden_layers']} (S F S S S F: sliding window {cfg['sliding_window']}, RoPE theta {cfg['rope_theta']:g} on sliding layers) |
| width | hidden {cfg['hidden_size']}, {cfg['num_attention_heads']} query heads / {cfg['num_key_value_heads']} KV heads of {cfg['head_dim']} |
| MoE | {cfg['num_experts']} experts, top-{cfg['num_experts_per_tok']}, latent {cfg['moe_latent_size']}, expert intermediate {cfg['expert_intermediate_size']} |
| parameters | {nparam / 1e6:.2f}M |
| vocabulary | {tok.get_vocab_size()} tokens: byte-level BPE trained on the corpus with Hugging Face `tokenizers` (Qwen2 split regex, NFC; specials `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`) |
| weights | experts NVFP4 (packed E2M1, E4M3 block scales of 16, fp32 global scale), router fp32, the rest bf16; {size / 1e6:.1f} MB ({size / 2**20:.2f} MiB) in this folder |

## Data
The King James Version of the Bible as Debian's `bible-kjv` / `bible-kjv-text` packages ship it (4.38),
printed with `bible -l100000 Gen1:1-Rev22:21`, verse numbers removed (one verse a line, a heading per
chapter): {nch} chapters, {len(train) + len(val)} tokens. Every 50th chapter (from the 8th) is held out
for validation: {nval} chapters, {len(val)} tokens ({100.0 * len(val) / (len(val) + len(train)):.1f}%).

## Training
AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), peak learning rate {args.lr:g}, 100 warm-up steps
then cosine to 10% over a {args.train_seconds:.0f}-second budget, batches of {B} x {T} tokens, bf16
autocast on one NVIDIA H200, load-balancing loss {args.aux:g}. The run took {step} steps in {train_time:.0f} s; the
weights kept are those of the best validation loss, at step {best[2]} ({best[2] * B * T / 1e6:.1f}M tokens, about
{best[2] * B * T / max(1, len(train)):.1f} epochs; the corpus is small, so later steps overfit). Loss curve: `loss.png`.

| | validation loss (nats/token) | perplexity |
|---|---|---|
| trained (fp32 weights, bf16 autocast) | {best[0]:.4f} | {math.exp(best[0]):.2f} |
| as shipped (bf16 + NVFP4 experts) | {vl_export:.4f} | {math.exp(vl_export):.2f} |

Greedy continuations (reference, float64, the shipped weights):

""" + "\n".join(f"- `{p}` → `{s.strip()}`" for p, s in samples) + """

## Reproduce
    sudo apt-get install bible-kjv && sh tools/train_demo/make_corpus.sh kjv.txt
    python3 tools/train_demo/train.py --corpus kjv.txt --reference-dir ../shared/reference --out OUTDIR \\
        --train-seconds 50 --eval-every 50
(on a GPU; the script first checks its batched model against the reference in float64). Check an engine:
`moeshard check --model models/muse-spark-demo --goldens models/muse-spark-demo/goldens.safetensors`;
perplexity and KL against a saved run (also llama.cpp's `--kl-divergence-base` files):
`moeshard eval --model models/muse-spark-demo --text FILE [--save-logits F.kld | --compare F.kld]`.

## License
The text of the King James Version is in the public domain (outside the United Kingdom, where the Crown's
letters patent apply; Debian's copyright file for `bible-kjv-text` calls its copyright expired). The
weights, tokenizer and goldens are derived from it and from this project's code, and are released under
the project's license.
"""
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(card)
    log(f"done in {time.time() - t_start:.0f}s; {size / 1e6:.2f} MB in {args.out}")


if __name__ == "__main__":
    main()
