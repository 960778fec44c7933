#!/usr/bin/env python3
"""PyTorch peers for the throughput issue's kernels, on the GPU machine (issue 14).

Measures, with CUDA events (median of warm runs), what a PyTorch user gets on the same shapes
as moeshard's kernel benchmarks:
  attention  torch.nn.functional.scaled_dot_product_attention restricted to its flash backend,
             causal prefill of N tokens (Qwen3-30B-A3B: 32 query / 4 KV heads x 128; Muse Spark:
             128 / 16 x 64), bf16; reported as TFLOP/s of the causal FLOPs (2 GEMMs, half the
             square) so it compares with model_ops_test's attention timings;
  decode     the same function for B sequences x 1 query over C cached keys each (dense KV, no
             paging), as GB/s of K/V read;
  experts    the MoE expert step of moe_expert_bench's issue shape (32 local experts, top-8 of
             256, L = I = 4096, bf16 weights, uniform routing): tokens grouped by expert on the
             GPU, gate|up and down per expert with torch._grouped_mm when this PyTorch has it, else
             one torch.matmul per expert; as ms per step and TFLOP/s (6 L I per routed pair).
Prints one JSON object per row and a table.

    python3 bench/torch_peers.py [--attn-len 4096] [--decode 64x4096] [--tokens 753,3012] [--iters 20]
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F


def timed(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]  # ms


def flash():
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:  # older PyTorch
        return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False)


def expand_kv(k, heads):  # GQA without relying on enable_gqa (not every version has it)
    return k.repeat_interleave(heads // k.shape[1], dim=1)


def attention_rows(n, iters):
    rows = []
    for name, hq, hkv, d in (("qwen3-30b", 32, 4, 128), ("muse-spark", 128, 16, 64)):
        q = torch.randn(1, hq, n, d, device="cuda", dtype=torch.bfloat16)
        k = expand_kv(torch.randn(1, hkv, n, d, device="cuda", dtype=torch.bfloat16), hq)
        v = expand_kv(torch.randn(1, hkv, n, d, device="cuda", dtype=torch.bfloat16), hq)
        with flash():
            ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), iters)
        flops = 2 * 2 * hq * d * n * n / 2
        rows.append({"row": "attention prefill (SDPA flash, causal)", "model": name, "tokens": n, "ms": ms,
                     "tflops": flops / ms / 1e9})
    return rows


def decode_rows(batch, ctx, iters):
    rows = []
    for name, hq, hkv, d in (("qwen3-30b", 32, 4, 128), ("muse-spark", 128, 16, 64)):
        q = torch.randn(batch, hq, 1, d, device="cuda", dtype=torch.bfloat16)
        kc = torch.randn(batch, hkv, ctx, d, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn(batch, hkv, ctx, d, device="cuda", dtype=torch.bfloat16)
        k, v = expand_kv(kc, hq), expand_kv(vc, hq)  # expanded once, outside the timing
        with flash():
            ms = timed(lambda: F.scaled_dot_product_attention(q, k, v), iters)
        kv_bytes = 2 * batch * hkv * ctx * d * 2  # the KV a GQA-aware kernel must read
        rows.append({"row": "attention decode (SDPA flash, dense KV)", "model": name, "batch": batch, "context": ctx,
                     "ms": ms, "kv_gb_per_s": kv_bytes / ms / 1e6})
    return rows


def experts_rows(tokens, iters, e_local=32, e_total=256, top_k=8, width=4096, inter=4096):
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    w_gu = torch.randn(e_local, 2 * inter, width, device="cuda", dtype=torch.bfloat16, generator=gen) / math.sqrt(width)
    w_d = torch.randn(e_local, width, inter, device="cuda", dtype=torch.bfloat16, generator=gen) / math.sqrt(inter)
    grouped = hasattr(torch, "_grouped_mm")
    for t in tokens:
        x = torch.randn(t, width, device="cuda", dtype=torch.bfloat16, generator=gen)
        ids = torch.stack([torch.randperm(e_total, device="cuda", generator=gen)[:top_k] for _ in range(t)])
        weights = torch.rand(t, top_k, device="cuda", generator=gen)

        def step():
            flat = ids.reshape(-1)
            local = flat < e_local
            pair = torch.nonzero(local).squeeze(1)
            expert = flat[pair]
            order = torch.argsort(expert, stable=True)
            pair, expert = pair[order], expert[order]
            xs = x[pair // top_k]
            counts = torch.bincount(expert, minlength=e_local)
            if grouped:
                offs = torch.cumsum(counts, 0).to(torch.int32)
                gu = torch._grouped_mm(xs, w_gu.transpose(1, 2), offs=offs)
                h = F.silu(gu[:, :inter]) * gu[:, inter:]
                y = torch._grouped_mm(h, w_d.transpose(1, 2), offs=offs)
            else:
                parts, start = [], 0
                for e, c in enumerate(counts.tolist()):
                    gu = xs[start:start + c] @ w_gu[e].t()
                    parts.append((F.silu(gu[:, :inter]) * gu[:, inter:]) @ w_d[e].t())
                    start += c
                y = torch.cat(parts)
            out = torch.zeros(t, width, device="cuda", dtype=torch.float32)
            out.index_add_(0, pair // top_k, y.float() * weights.reshape(-1)[pair].unsqueeze(1))
            return out

        ms = timed(step, iters)
        pairs = int((ids < e_local).sum())
        rows.append({"row": "MoE expert step (bf16 weights, " + ("torch._grouped_mm" if grouped else "per-expert matmul")
                     + ")", "tokens": t, "local_pairs": pairs, "ms": ms,
                     "tflops": 6 * width * inter * pairs / ms / 1e9})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attn-len", type=int, default=4096)
    ap.add_argument("--decode", default="64x4096", help="BATCHxCONTEXT")
    ap.add_argument("--tokens", default="753,3012")
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch_peers: no CUDA device")
    batch, ctx = (int(v) for v in a.decode.split("x"))
    rows = attention_rows(a.attn_len, a.iters) + decode_rows(batch, ctx, a.iters)
    rows += experts_rows([int(t) for t in a.tokens.split(",")], a.iters)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for r in rows:
        print(json.dumps(r))
    for r in rows:
        extra = ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items() if k != "row")
        print(f"{r['row']}: {extra}")


if __name__ == "__main__":
    main()
