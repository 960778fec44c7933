#!/usr/bin/env python3
"""Builds tests/testdata/muse-spark-kv4: a Muse Spark with 4 KV heads and 8 experts, so tensor
parallel over 4 ranks divides it (every shared test model has 2 KV heads), with goldens from the
reference this project did not write: ../shared/reference/make_testdata.py's build_muse (weights from
muse_spark.random_model, goldens from muse_spark.MuseSpark in float64).

Usage: python3 make_kv4.py SHARED/reference OUT_DIR
Needs PyTorch (Debian 12's python3-torch 1.13 is enough). Without the `safetensors` package a
minimal stand-in for safetensors.torch's save_file / load_file (the format's 8-byte header length,
JSON header, little-endian data) is installed first.
"""
import importlib
import json
import struct
import sys
import types

import torch

DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int32: "I32",
          torch.int64: "I64", torch.uint8: "U8", torch.int8: "I8", torch.float64: "F64"}
VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16}


def save_file(tensors, path, metadata=None):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        data = t.view(VIEW.get(t.dtype, t.dtype)).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def load_file(path):
    buf = open(path, "rb").read()
    n = struct.unpack_from("<Q", buf)[0]
    header = json.loads(buf[8:8 + n])
    by_name = {v: k for k, v in DTYPES.items()}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = by_name[info["dtype"]]
        a, b = info["data_offsets"]
        raw = bytearray(buf[8 + n + a:8 + n + b])
        t = torch.frombuffer(raw, dtype=VIEW.get(dtype, dtype)) if raw else torch.empty(0, dtype=VIEW.get(dtype, dtype))
        out[name] = t.view(dtype).reshape(info["shape"])
    return out


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    try:
        importlib.import_module("safetensors.torch")
    except ImportError:
        pkg, mod = types.ModuleType("safetensors"), types.ModuleType("safetensors.torch")
        mod.save_file, mod.load_file = save_file, load_file
        pkg.torch = mod
        sys.modules["safetensors"], sys.modules["safetensors.torch"] = pkg, mod
    sys.path.insert(0, sys.argv[1])
    import make_testdata  # noqa: E402  (../shared/reference)
    torch.set_num_threads(2)
    make_testdata.build_muse(sys.argv[2], "muse-spark-kv4", dict(
        vocab_size=512, hidden_size=128, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
        head_dim=16, sliding_window=16, rope_theta=10000.0, num_experts=8, num_experts_per_tok=2,
        moe_latent_size=64, expert_intermediate_size=64, max_position_embeddings=4096), seed=3, quantize=False)


if __name__ == "__main__":
    main()
