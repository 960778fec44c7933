#!/usr/bin/env python3
"""Narrows a goldens.safetensors file (format: shared/testdata/README.md) to fit the demo model's
size budget, keeping every stored value bit for bit: the sequences named by --full keep their
full float32 logits [T, V]; every other sequence keeps its ids and lse and has its logits replaced
by the top-K of each row (topk_ids, topk_logits: the same float32 values, largest first, ties by
lower id), which `moeshard check` compares in its top-k mode. gen* tensors are copied as they are.
No PyTorch or numpy needed.

    python3 tools/train_demo/trim_goldens.py IN.safetensors OUT.safetensors --full seq0 --topk 20
"""
import argparse
import json
import struct

DTYPE_BYTES = {"F32": 4, "I32": 4}


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        if t["dtype"] not in DTYPE_BYTES:
            raise SystemExit(f"{path}: {name} has dtype {t['dtype']}; only F32 and I32 are expected")
        a, b = t["data_offsets"]
        tensors[name] = (t["dtype"], t["shape"], data[a:b])
    return tensors, meta


def write(path, tensors, meta):
    header, blobs, off = {}, [], 0
    if meta:
        header["__metadata__"] = meta
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def topk_rows(raw, rows, vocab, k):
    """The k largest float32 values of each row, as raw bytes of ids (I32) and values (F32)."""
    ids, vals = bytearray(), bytearray()
    for r in range(rows):
        row = raw[r * vocab * 4:(r + 1) * vocab * 4]
        values = struct.unpack(f"<{vocab}f", row)
        best = sorted(range(vocab), key=lambda i: (-values[i], i))[:k]
        ids += struct.pack(f"<{k}i", *best)
        vals += b"".join(row[i * 4:(i + 1) * 4] for i in best)  # the stored bytes, untouched
    return bytes(ids), bytes(vals)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--full", action="append", default=[], help="sequence keeping full logits (repeatable)")
    ap.add_argument("--topk", type=int, default=20)
    args = ap.parse_args()
    tensors, meta = read(args.src)
    out = {}
    for name, (dtype, shape, raw) in tensors.items():
        seq, _, field = name.partition(".")
        if field != "logits" or seq in args.full:
            out[name] = (dtype, shape, raw)
            continue
        if f"{seq}.lse" not in tensors:
            raise SystemExit(f"{seq}: top-k mode needs {seq}.lse")
        rows, vocab = shape
        ids, vals = topk_rows(raw, rows, vocab, args.topk)
        out[f"{seq}.topk_ids"] = ("I32", [rows, args.topk], ids)
        out[f"{seq}.topk_logits"] = ("F32", [rows, args.topk], vals)
    meta = dict(meta)
    meta["trimmed"] = (f"full logits kept for {', '.join(args.full) or 'none'}; top-{args.topk} logits and lse "
                       "for the other sequences (tools/train_demo/trim_goldens.py)")
    write(args.dst, out, meta)


if __name__ == "__main__":
    main()
