// Row quantizers for GGUF block types, bit-exact with ggml's reference quantizers
// (ggml-quants.c, quantize_row_q8_0_ref and quantize_row_mxfp4_ref), which
// llama.cpp's gguf-py also mirrors:
//   Q8_0  (34 bytes / 32 values): d = amax / 127 stored as f16; q = roundf(x * (1 / d)),
//         rounding half away from zero, computed with the unrounded d.
//   MXFP4 (17 bytes / 32 values): e8m0 exponent e = floor(log2(amax)) - 2 + 127 (0 for an
//         all-zero block); each value takes the E2M1 code nearest to x / 2^(e-127) (ties to
//         the code met first in ggml's table order 0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, ...,
//         that is toward zero); element j in the low nibble of byte j, j+16 in the high one.
//         Values above 6 * 2^(e-127) saturate to +-6 (amax / 2^(e-127) lies in [4, 8)).
// The matching expansion is kernels/cpu/dequant.h's DequantQ8_0Block / DequantMxfp4Block.
#pragma once

#include <cstdint>
#include <string>

namespace moeshard {

inline constexpr int kGgufBlock = 32;
inline constexpr int kQ8_0BlockBytes = 34;
inline constexpr int kMxfp4BlockBytes = 17;

// n must be a multiple of 32; appends n / 32 blocks to `out`.
void QuantizeRowQ8_0(const float* x, int64_t n, std::string* out);
void QuantizeRowMxfp4(const float* x, int64_t n, std::string* out);

// The E8M0 exponent byte ggml picks for a block whose largest magnitude is `amax`.
uint8_t Mxfp4Exponent(float amax);

}  // namespace moeshard
