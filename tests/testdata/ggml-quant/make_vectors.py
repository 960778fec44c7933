#!/usr/bin/env python3
"""Reference vectors for moeshard's GGUF quantizers, made by llama.cpp's own gguf-py.

Writes to OUT_DIR:
  input.f32   float32 rows of 32 values (little-endian): random blocks at scales from 1e-30 to
              1e30, and edge cases (zeros, one non-zero value, exact rounding ties of Q8_0,
              midpoints between E2M1 codes, amax exactly a power of two, values that saturate);
  q8_0.bin    gguf.quants.quantize(input, Q8_0): 34 bytes per block;
  mxfp4.bin   gguf.quants.quantize(input, MXFP4): 17 bytes per block.
tests/formats/gguf_quant_ref_test.cc requires QuantizeRowQ8_0 / QuantizeRowMxfp4 to give these bytes.

Usage: python3 make_vectors.py LLAMA_CPP_SRC/gguf-py OUT_DIR
(gguf-py from ../shared/peers/llama.cpp-src.tar.xz; numpy from Debian's python3-numpy)
"""
import sys

import numpy as np


def blocks():
    rng = np.random.default_rng(17)
    out = []
    for scale in (1e-30, 1e-6, 1e-3, 0.1, 1.0, 3.0, 100.0, 1e6, 1e30):
        out.extend(rng.standard_normal((8, 32)) * scale)
        out.extend(rng.uniform(-scale, scale, (4, 32)))
    out.append(np.zeros(32))
    one = np.zeros(32)
    one[5] = -2.5
    out.append(one)
    # Q8_0 ties: amax 127 gives d = 1, so k + 0.5 sits halfway between two codes.
    tie = np.arange(32) - 15.5
    tie[0] = 127.0
    out.append(tie)
    out.append(-tie)
    # MXFP4: amax 4 -> e = 127, scale 1: midpoints between the E2M1 magnitudes 0 .5 1 1.5 2 3 4 6.
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 4.0] * 4)
    mids[8:16] *= -1
    out.append(mids)
    for amax in (1.0, 2.0, 4.0, 7.99, 8.0, 0.5, 2.0 ** -20, 2.0 ** 20):
        b = rng.uniform(-amax, amax, 32)
        b[3] = amax
        out.append(b)
    # Values past 6 * scale that saturate (amax / scale in [4, 8)).
    sat = np.linspace(-7.5, 7.5, 32)
    out.append(sat)
    return np.array(out, dtype=np.float32)


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    sys.path.insert(0, sys.argv[1])
    from gguf import GGMLQuantizationType, quants  # noqa: E402  (llama.cpp's gguf-py)
    x = blocks()
    out = sys.argv[2]
    x.tofile(f"{out}/input.f32")
    for name, qtype in (("q8_0", GGMLQuantizationType.Q8_0), ("mxfp4", GGMLQuantizationType.MXFP4)):
        q = quants.quantize(x, qtype)
        q.astype(np.uint8).tofile(f"{out}/{name}.bin")
        print(name, x.shape[0], "blocks,", q.nbytes, "bytes")


if __name__ == "__main__":
    main()
