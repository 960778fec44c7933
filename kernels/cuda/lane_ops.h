// The bit-level lane operations the weight-decode kernels are built from — byte permute, funnel
// shift, high multiply, bf16x2 multiply and subtract, int8 to bf16 — for host and device alike: the
// device runs the instruction, the host an exact emulation of it. So the decode helpers written
// with them (kernels/moe/moe_block_decode.h, kernels/moe/moe_stream_decode.h, I8x4ToBf16 below)
// are the same code in a kernel and in a CPU test (tests/kernels/moe_block_decode_test.cc,
// tests/kernels/moe_stream_layout_test.cc). Free of CUDA headers: host code includes it.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MOESHARD_LANE_HD __host__ __device__ __forceinline__
#else
#define MOESHARD_LANE_HD inline
#endif

namespace moeshard::lane {

// Bytes of b:a (a the low word) chosen by the low 3 bits of each selector nibble.
MOESHARD_LANE_HD uint32_t BytePerm(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, sel);
#else
  const uint64_t x = (uint64_t{b} << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((x >> (8 * ((sel >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
#endif
}

// The low 32 bits of (hi:lo) >> (shift % 32).
MOESHARD_LANE_HD uint32_t FunnelShiftR(uint32_t lo, uint32_t hi, int shift) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(lo, hi, shift);
#else
  return static_cast<uint32_t>(((uint64_t{hi} << 32) | lo) >> (shift & 31));
#endif
}

// The high 32 bits of a · b.
MOESHARD_LANE_HD uint32_t MulHi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((uint64_t{a} * b) >> 32);
#endif
}

// The bits of one 32-bit type read as another (memcpy: no aliasing rules broken, on host or device).
template <typename To, typename From>
MOESHARD_LANE_HD To BitCast(From v) {
  static_assert(sizeof(To) == sizeof(From), "same size");
  To t;
  std::memcpy(&t, &v, sizeof(t));
  return t;
}
MOESHARD_LANE_HD float Bits(uint32_t u) { return BitCast<float>(u); }
MOESHARD_LANE_HD uint32_t FloatBits(float f) { return BitCast<uint32_t>(f); }

// fp32 -> bf16, to nearest, ties to even; NaN stays NaN.
MOESHARD_LANE_HD uint16_t ToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Both bf16 halves multiplied, each rounded once to bf16 (the product of two bf16 values is
// exact in fp32, so the host's fp32 multiply and one rounding match the instruction).
MOESHARD_LANE_HD uint32_t MulBf16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  const float lo = Bits(a << 16) * Bits(b << 16), hi = Bits(a & 0xffff0000u) * Bits(b & 0xffff0000u);
  return uint32_t{ToBf16(lo)} | (uint32_t{ToBf16(hi)} << 16);
#endif
}

// Both bf16 halves subtracted, each rounded once to bf16. The host's fp32 difference is exact for
// the operands this is used with (two bf16 values of neighbouring exponents, as in I8x4ToBf16).
MOESHARD_LANE_HD uint32_t SubBf16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  const float lo = Bits(a << 16) - Bits(b << 16), hi = Bits(a & 0xffff0000u) - Bits(b & 0xffff0000u);
  return uint32_t{ToBf16(lo)} | (uint32_t{ToBf16(hi)} << 16);
#endif
}

// 4 int8 → bf16 pairs (b0, b1) and (b2, b3), exactly. For a byte q = 0x80·s + m (m < 128),
// the bf16 0x43·m is 128 + m and 0x43·(0x80·s) is 128 or 256: their difference is q.
MOESHARD_LANE_HD void I8x4ToBf16(uint32_t q, uint32_t& lo, uint32_t& hi) {
  const uint32_t m = q & 0x7F7F7F7Fu, s = q & 0x80808080u;
  lo = SubBf16x2(BytePerm(m, 0x43434343u, 0x4140), BytePerm(s, 0x43434343u, 0x4140));
  hi = SubBf16x2(BytePerm(m, 0x43434343u, 0x4342), BytePerm(s, 0x43434343u, 0x4342));
}

}  // namespace moeshard::lane
