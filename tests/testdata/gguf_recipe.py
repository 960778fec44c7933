#!/usr/bin/env python3
"""Records what rebuilding llama.cpp's two GGUFs of qwen3moe-tok needs (Python standard library only).

../shared/testdata/qwen3moe-tok/model-f16.gguf and model-q8_0.gguf (written by llama.cpp's
convert_hf_to_gguf.py, ~20 MB each) are too large to commit. Everything in them but the tensor data
(header, metadata with the tokenizer, tensor table: ~5.9 MB, ~1.3 MB compressed) is llama.cpp's own
bytes; the tensor data follows from model.safetensors. This script writes

  gguf-heads.xz    the two files' bytes up to the end of their tensor tables, f16 then q8_0;
  gguf-layout.txt  per file: its head's length, data offset, size and SHA-256; per tensor: name,
                   ggml type, offset in the data section and byte size.

testdata_gguf (tests/testdata/rebuild_gguf.cc) rebuilds each file from these and model.safetensors
with moeshard's own f16 conversion and Q8_0 quantizer, and tests/testdata/assemble.sh requires the
result's SHA-256 to equal the original's: the rebuild is llama.cpp's file, byte for byte.

Usage: gguf_recipe.py SHARED/testdata/qwen3moe-tok OUT_DIR
       gguf_recipe.py --diff gguf-layout.txt REBUILT.gguf   (names the tensors whose bytes differ)
"""
import hashlib
import lzma
import struct
import sys

FILES = ("model-f16.gguf", "model-q8_0.gguf")
SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
BLOCK = {0: (1, 4), 1: (1, 2), 8: (32, 34), 30: (1, 2)}  # ggml type: (values per block, bytes per block)


class Reader:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return v[0]

    def string(self):
        n = self.take("Q")
        self.pos += n
        return self.buf[self.pos - n:self.pos].decode("utf-8")

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("I"), self.take("Q")
            return [self.value(et) for _ in range(n)]
        return self.take(SCALAR[t])


def layout(buf):
    r = Reader(buf)
    if r.take("4s") != b"GGUF" or r.take("I") != 3:
        raise SystemExit("not a GGUF v3 file")
    n_tensors, n_kv = r.take("Q"), r.take("Q")
    align = 32
    for _ in range(n_kv):
        key, t = r.string(), r.take("I")
        v = r.value(t)
        if key == "general.alignment":
            align = v
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("Q") for _ in range(r.take("I"))]
        t, off = r.take("I"), r.take("Q")
        per, nb = BLOCK[t]
        n = 1
        for d in dims:
            n *= d
        tensors.append((name, t, off, n // per * nb))
    return r.pos, (r.pos + align - 1) // align * align, tensors


def diff(layout_path, rebuilt):
    buf = open(rebuilt, "rb").read()
    name = rebuilt.rsplit("/", 1)[-1]
    current, data_off, bad = None, 0, 0
    for line in open(layout_path):
        f = line.split()
        if f[0] == "file":
            current, data_off = f[1], int(f[4])
        elif current == name:
            off, nbytes = data_off + int(f[3]), int(f[4])
            if hashlib.sha256(buf[off:off + nbytes]).hexdigest() != f[5]:
                print(f"{name}: tensor {f[1]} (ggml type {f[2]}) differs from llama.cpp's bytes")
                bad += 1
    return bad


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--diff":
        sys.exit(1 if diff(sys.argv[2], sys.argv[3]) else 0)
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    heads, lines = b"", []
    for f in FILES:
        buf = open(f"{src}/{f}", "rb").read()
        head_len, data_off, tensors = layout(buf)
        if any(b != 0 for b in buf[head_len:data_off]):
            raise SystemExit(f"{f}: padding after the tensor table is not zero")
        lines.append(f"file {f} {len(heads)} {head_len} {data_off} {len(buf)} {hashlib.sha256(buf).hexdigest()}")
        heads += buf[:head_len]
        for name, t, off, nbytes in tensors:
            lines.append(f"tensor {name} {t} {off} {nbytes} "
                         f"{hashlib.sha256(buf[data_off + off:data_off + off + nbytes]).hexdigest()}")
    with open(f"{out}/gguf-heads.xz", "wb") as fh:
        fh.write(lzma.compress(heads, preset=9 | lzma.PRESET_EXTREME))
    with open(f"{out}/gguf-layout.txt", "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
