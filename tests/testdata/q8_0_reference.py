#!/usr/bin/env python3
"""Goldens for qwen3moe-tok/model-q8_0.gguf computed by Hugging Face transformers.

../shared/testdata/README.md accepts model-q8_0.gguf against the unquantized goldens with a
loose Q8_0 tolerance that came from an emulation quantizing only the expert down
projections. The file itself (llama.cpp's convert_hf_to_gguf.py) also quantizes attn_output
(its rows of 64 are a multiple of 32). This script answers what the file's weights really
compute, with a reference moeshard did not write:

  1. reads the GGUF (a small reader below: header, metadata skipped, tensor table) and
     dequantizes every Q8_0 tensor exactly as ggml does (f16 scale d times int8 q);
  2. loads model.safetensors into transformers' Qwen3MoeForCausalLM in float32; checks every
     F16 tensor of the file equals the transformers parameter it maps to (bit for bit: bf16 ->
     f16 is exact here) and every Q8_0 tensor lies within ~half a quantization step of its
     parameter (so the name and layout mapping is right), then swaps in the dequantized values;
  3. runs the ids of the original goldens (seq0-2 and gen0's prompt) the way
     ../shared/reference/make_testdata.py does: float32 forward, float64 lse and top-20,
     greedy continuation by full forwards;
  4. writes OUT (same keys as goldens.safetensors) and prints how far the file's own outputs
     are from the unquantized goldens (top-1 agreement, max lse and top-20 differences).

Needs torch, transformers, safetensors and numpy (the GPU machine has them).
Usage: q8_0_reference.py TESTDATA/qwen3moe-tok OUT.safetensors
"""
import os
import struct
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

GGML_F32, GGML_F16, GGML_Q8_0, GGML_BF16 = 0, 1, 8, 30


def read_gguf(path):
    """{name: np.ndarray float32 in numpy (row-major, ggml dims reversed) order, type}."""
    buf = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string():
        nonlocal pos
        n = take("Q")
        s = buf[pos:pos + n].decode("utf-8")
        pos += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t in scalar:
            return take(scalar[t])
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        raise ValueError(f"gguf value type {t}")

    assert buf[:4] == b"GGUF", "not a GGUF file"
    pos = 4
    version, n_tensors, n_kv = take("I"), take("Q"), take("Q")
    assert version in (2, 3), version
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("I")
        dims = [take("Q") for _ in range(nd)]
        infos.append((name, dims, take("I"), take("Q")))
    align = meta.get("general.alignment", 32)
    base = (pos + align - 1) // align * align
    out = {}
    for name, dims, t, off in infos:
        shape = list(reversed(dims))
        n = int(np.prod(dims))
        at = base + off
        if t == GGML_F32:
            a = np.frombuffer(buf, np.float32, n, at).astype(np.float32)
        elif t == GGML_F16:
            a = np.frombuffer(buf, np.float16, n, at).astype(np.float32)
        elif t == GGML_BF16:
            a = (np.frombuffer(buf, np.uint16, n, at).astype(np.uint32) << 16).view(np.float32)
        elif t == GGML_Q8_0:
            blocks = np.frombuffer(buf, np.uint8, n // 32 * 34, at).reshape(-1, 34)
            d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
            q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
            a = (d * q).reshape(-1)
        else:
            raise ValueError(f"{name}: ggml type {t} not handled")
        out[name] = (a.reshape(shape), t)
    return out


def F16Err(param, value):
    """Largest |value - param| in units of param's f16 spacing (1 ulp; subnormals included)."""
    p = param.to(torch.float64)
    ulp = torch.clamp(p.abs(), min=2.0 ** -14) * 2.0 ** -10
    return ((value.to(torch.float64) - p).abs() / ulp).max().item()


def hf_targets(params, gname):
    """The transformers parameter (name, index or None) a GGUF tensor name maps to."""
    parts = gname.split(".")
    if parts[0] != "blk":
        return {"token_embd.weight": [("model.embed_tokens.weight", None)],
                "output_norm.weight": [("model.norm.weight", None)],
                "output.weight": [("lm_head.weight", None)]}.get(gname, [])
    n, what = parts[1], ".".join(parts[2:])
    p = f"model.layers.{n}."
    simple = {"attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
              "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
              "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
              "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
              "ffn_gate_inp.weight": "mlp.gate.weight"}
    if what in simple:
        return [(p + simple[what], None)]
    proj = {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj", "ffn_down_exps.weight": "down_proj"}[what]
    if p + f"mlp.experts.0.{proj}.weight" in params:  # one module per expert
        e = 0
        out = []
        while p + f"mlp.experts.{e}.{proj}.weight" in params:
            out.append((p + f"mlp.experts.{e}.{proj}.weight", None))
            e += 1
        return out
    if proj == "down_proj":
        return [(p + "mlp.experts.down_proj", "all")]
    return [(p + "mlp.experts.gate_up_proj", proj)]  # fused [E, 2I, H]


def main():
    src, out_path = sys.argv[1], sys.argv[2]
    from transformers import Qwen3MoeForCausalLM
    m = Qwen3MoeForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    params = dict(m.named_parameters())
    q8 = read_gguf(os.path.join(src, "model-q8_0.gguf"))
    quantized = sorted(k for k, (_, t) in q8.items() if t == GGML_Q8_0)
    print("Q8_0 tensors in the file:", quantized, file=sys.stderr)
    with torch.no_grad():
        for g, (deq, t) in sorted(q8.items()):
            targets = hf_targets(params, g)
            assert targets, f"{g}: no transformers parameter"
            if len(targets) > 1:  # one module per expert: split the stacked tensor
                views = [(params[n], deq[e]) for e, (n, _) in enumerate(targets)]
            else:
                n, how = targets[0]
                p = params[n]
                if how is None or how == "all":
                    views = [(p, deq)]
                else:  # fused gate_up_proj [E, 2I, H]: the half (or interleave) that holds this matrix
                    half = p.shape[1] // 2
                    cands = [p[:, :half], p[:, half:], p[:, 0::2], p[:, 1::2]]
                    tw = torch.from_numpy(np.ascontiguousarray(deq))
                    errs = [F16Err(c.detach(), tw) if tuple(c.shape) == tuple(tw.shape) else float("inf") for c in cands]
                    best = int(np.argmin(errs))
                    assert t != GGML_Q8_0 and errs[best] <= 1.0, f"{g}: no part of {n} holds it ({errs})"
                    views = [(cands[best], deq)]
            for dst, d in views:
                d = torch.from_numpy(np.ascontiguousarray(d))
                assert tuple(dst.shape) == tuple(d.shape), f"{g}: shape {tuple(d.shape)} vs {tuple(dst.shape)}"
                if t != GGML_Q8_0:
                    # F16/F32 in the file: the transformers parameter rounded to f16 (checks the mapping)
                    err = F16Err(dst.detach(), d)
                    assert err <= 1.0, f"{g}: differs from the transformers parameter ({err:.2f} f16 ulps)"
                else:
                    # Q8_0: within ~half a step (d = amax/127 of its block of 32) of the parameter
                    pb = dst.detach().reshape(-1, 32)
                    step = pb.abs().amax(1, keepdim=True) / 127
                    err = ((d.reshape(-1, 32) - pb).abs() / step.clamp_min(1e-30)).max().item()
                    assert err <= 0.6, f"{g}: dequantized values {err:.2f} steps from the parameter"
                # The model computes with exactly the file's values.
                dst.copy_(d)
            print(f"{g}: {'Q8_0' if t == GGML_Q8_0 else 'F16/F32'} values of the file loaded (max error {err:.3f} "
                  f"{'steps' if t == GGML_Q8_0 else 'f16 ulps'} from the bf16 parameter)", file=sys.stderr)

    ref = load_file(os.path.join(src, "goldens.safetensors"))
    fwd = lambda ids: m(ids[None].long()).logits[0]
    g = {}
    agree = total = 0
    max_lse = max_topk = 0.0
    worst = None
    for k in range(3):
        ids = ref[f"seq{k}.ids"]
        with torch.no_grad():
            lg = fwd(ids).to(torch.float64)
        g[f"seq{k}.ids"] = ids.clone()
        g[f"seq{k}.lse"] = torch.logsumexp(lg, -1).to(torch.float32)
        v, i = torch.topk(lg, 20, dim=-1)
        g[f"seq{k}.topk_ids"] = i.to(torch.int32)
        g[f"seq{k}.topk_logits"] = v.to(torch.float32)
        dl = (g[f"seq{k}.lse"] - ref[f"seq{k}.lse"]).abs()
        # the unquantized goldens' top-20 logits, read from this model's logits
        dt = (lg.gather(1, ref[f"seq{k}.topk_ids"].long()).to(torch.float32) - ref[f"seq{k}.topk_logits"]).abs().max(1).values
        agree += int((i[:, 0].to(torch.int32) == ref[f"seq{k}.topk_ids"][:, 0]).sum())
        total += ids.numel()
        pos = int(torch.argmax(dl))
        if dl[pos] > max_lse:
            max_lse, worst = float(dl[pos]), (k, pos)
        max_topk = max(max_topk, float(dt.max()))
    ids = ref["gen0.prompt"].long()
    new = []
    for _ in range(ref["gen0.greedy"].numel()):
        with torch.no_grad():
            nxt = int(fwd(ids)[-1].argmax())
        new.append(nxt)
        ids = torch.cat([ids, torch.tensor([nxt])])
    g["gen0.prompt"] = ref["gen0.prompt"].clone()
    g["gen0.greedy"] = torch.tensor(new, dtype=torch.int32)
    same = sum(int(a == b) for a, b in zip(new, ref["gen0.greedy"].tolist()))
    save_file({k: v.contiguous() for k, v in g.items()}, out_path)
    print(f"transformers on the file's dequantized weights vs the unquantized goldens: top-1 {agree}/{total} "
          f"({100.0 * agree / total:.1f} %), max lse diff {max_lse:.4f} at seq{worst[0]} pos {worst[1]}, "
          f"max top-20 logit diff {max_topk:.4f}, gen0 {same}/{len(new)} tokens equal")


if __name__ == "__main__":
    main()
