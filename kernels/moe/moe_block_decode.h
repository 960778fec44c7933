// One 32-column block of a stored Q8_0, MXFP4 or BF16 weight row as 32 bf16 values in natural
// column order, from the 4-byte words that hold it, the block starting `off` (0..3) bytes into
// word 0 (a copy of whole words aligned down; the expansion pass of moe_wgmma.cu packs each
// block's own bytes from word 0, off 0; BF16 blocks are 16-byte aligned: off is 0). Host and device
// alike: the device uses the byte-permute, funnel-shift and bf16x2-multiply instructions, the host
// exact emulations of them (kernels/cuda/lane_ops.h), so tests/kernels/moe_block_decode_test.cc
// checks the bit work against kernels/cpu/dequant on the CPU.
//
// MXFP4: byte j of the 16 code bytes holds column j (low nibble) and j + 16 (high). A pair of
// neighbouring bytes spread over the two halves of a word (byte permute) puts two codes' three
// magnitude bits at bits 6..8 of their bf16 halves and their signs at bit 15: each half then holds
// e2m1 · 2^-126 (code 1, 0.5, as the subnormal 2^-127); two exact bf16x2 multiplies, by 2^126 and
// by the block's 2^(s-127), give the value, exact in bf16 (as moe_device.cuh does for NVFP4).
// Q8_0: d (f16) · q (int8) in fp32, rounded to bf16 (to nearest, ties to even).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/weight_ref.h"
#include "kernels/cuda/lane_ops.h"

#if defined(__CUDACC__)
#define MOESHARD_BD_HD __host__ __device__ __forceinline__
#else
#define MOESHARD_BD_HD inline
#endif

namespace moeshard::block_decode {

using lane::BitCast;
using lane::Bits;
using lane::BytePerm;
using lane::FloatBits;
using lane::FunnelShiftR;
using lane::MulBf16x2;
using lane::ToBf16;

// f16 -> fp32, exact (subnormals included).
MOESHARD_BD_HD float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0) return Bits(sign | FloatBits(static_cast<float>(man) * 0x1p-24f));
  if (exp == 31) return Bits(sign | (man ? 0x7fc00000u : 0x7f800000u));
  return Bits(sign | ((exp + 112) << 23) | (man << 13));
}

// The 32-bit little-endian window that starts b (0..7) bytes into word j of w.
MOESHARD_BD_HD uint32_t Window(const uint32_t* w, int j, int b) {
  return b >= 4 ? (b == 4 ? w[j + 1] : FunnelShiftR(w[j + 1], w[j + 2], 8 * (b - 4)))
                : (b == 0 ? w[j] : FunnelShiftR(w[j], w[j + 1], 8 * b));
}

// Words a block needs from the aligned-down start: Q8_0 34 + 3 bytes, MXFP4 17 + 3, BF16 64.
constexpr int kRawWords = 16;
MOESHARD_BD_HD int RawWords(WeightFormat f) {
  return f == WeightFormat::kQ8_0 ? 10 : f == WeightFormat::kMXFP4 ? 5 : 16;
}

// The block at byte `off` of w (w[0..kRawWords) readable; only RawWords(fmt) of them, plus for
// the shifts the word after, are used) as 16 bf16 pairs, columns (2i, 2i + 1) in out[i].
MOESHARD_BD_HD void DecodeBlock(WeightFormat fmt, const uint32_t* w, int off, uint32_t out[16]) {
  if (fmt == WeightFormat::kBF16) {
    for (int i = 0; i < 16; ++i) out[i] = w[i];
    return;
  }
  if (fmt == WeightFormat::kQ8_0) {
    const float d = F16ToF32(static_cast<uint16_t>(Window(w, 0, off) & 0xffff));
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < 8; ++j) {
      const uint32_t q = Window(w, j, off + 2);
      for (int h = 0; h < 2; ++h) {
        const float v0 = d * static_cast<float>(static_cast<int8_t>(q >> (16 * h)));
        const float v1 = d * static_cast<float>(static_cast<int8_t>(q >> (16 * h + 8)));
        out[2 * j + h] = uint32_t{ToBf16(v0)} | (uint32_t{ToBf16(v1)} << 16);
      }
    }
    return;
  }
  const uint32_t s = (w[0] >> (8 * off)) & 0xff;                       // MXFP4's e8m0 scale
  const uint32_t sb = s == 0 ? 0x0040u : s == 255 ? 0x7fc0u : s << 7;  // 2^(s-127) as bf16
  const uint32_t sc = sb | (sb << 16);
  constexpr uint32_t k2p126 = 0x7E807E80u, kMag = 0x01C001C0u, kSign = 0x80008000u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < 4; ++j) {
    const uint32_t cw = Window(w, j, off + 1);  // code bytes 4j..4j+3
    for (int h = 0; h < 2; ++h) {
      const uint32_t x = BytePerm(cw, 0, h == 0 ? 0x4140 : 0x4342);  // bytes 4j+2h, 4j+2h+1 as halves
      const uint32_t lo = ((x << 6) & kMag) | ((x << 12) & kSign), hi = ((x << 2) & kMag) | ((x << 8) & kSign);
      out[2 * j + h] = MulBf16x2(MulBf16x2(lo, k2p126), sc);
      out[8 + 2 * j + h] = MulBf16x2(MulBf16x2(hi, k2p126), sc);
    }
  }
}

}  // namespace moeshard::block_decode
