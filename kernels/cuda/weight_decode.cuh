// Device decoding of one stored weight element, bit for bit what kernels/cpu/dequant.cc
// computes in fp32: the scalar conversions build the float's bits directly (every value
// is exact), and the scale products use __fmul_rn in the CPU's order so that no FMA
// contraction or flush-to-zero can change a bit.
#pragma once

#include <cstdint>

#include "kernels/cpu/weight_ref.h"

namespace moeshard::gpu {

__device__ __forceinline__ float BitsToF32(uint32_t u) { return __uint_as_float(u); }

__device__ __forceinline__ float DevBf16ToF32(uint16_t h) { return BitsToF32(uint32_t{h} << 16); }

// As common/dtype.h F32ToBf16: round to nearest even, NaN stays NaN.
__device__ __forceinline__ uint16_t DevF32ToBf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// As F16ToF32Exact; NaN is the CPU's NAN (0x7fc00000) with the sign applied.
__device__ __forceinline__ float DevF16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0) return BitsToF32(sign | __float_as_uint(__fmul_rn(static_cast<float>(man), 0x1p-24f)));
  if (exp == 31) return BitsToF32(sign | (man ? 0x7fc00000u : 0x7f800000u));
  return BitsToF32(sign | ((exp + 112) << 23) | (man << 13));
}

// As E4M3ToF32Exact (no infinities; S.1111.111 is NaN).
__device__ __forceinline__ float DevE4M3ToF32(uint8_t v) {
  uint32_t sign = static_cast<uint32_t>(v >> 7) << 31, exp = (v >> 3) & 0xf, man = v & 7;
  if (exp == 15 && man == 7) return BitsToF32(0x7fc00000u);
  if (exp == 0) return BitsToF32(sign | __float_as_uint(__fmul_rn(static_cast<float>(man), 0x1p-9f)));
  return BitsToF32(sign | ((exp + 120) << 23) | (man << 20));
}

// As E8M0ToF32: 2^(v-127); v = 0 is the subnormal 2^-127, v = 255 NaN.
__device__ __forceinline__ float DevE8M0ToF32(uint8_t v) {
  if (v == 0xff) return BitsToF32(0x7fc00000u);
  return BitsToF32(v == 0 ? 0x00400000u : uint32_t{v} << 23);
}

// As kE2M1Values (code 8 is -0).
__device__ __forceinline__ float DevE2M1ToF32(uint32_t code) {
  constexpr float kMag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  float m = kMag[code & 7];
  return (code & 8) ? -m : m;
}

// Element (row, col) of the view `w`, whose pointers are device pointers.
__device__ __forceinline__ float DecodeWeight(const WeightRef& w, int64_t row, int64_t col) {
  const uint8_t* r = w.data + row * w.row_stride_bytes;
  const int64_t c = w.col_offset + col;
  switch (w.format) {
    case WeightFormat::kF32:
      return reinterpret_cast<const float*>(r)[c];
    case WeightFormat::kBF16:
      return DevBf16ToF32(reinterpret_cast<const uint16_t*>(r)[c]);
    case WeightFormat::kF16:
      return DevF16ToF32(reinterpret_cast<const uint16_t*>(r)[c]);
    case WeightFormat::kQ8_0: {
      const uint8_t* b = r + (c / 32) * 34;
      float d = DevF16ToF32(static_cast<uint16_t>(b[0] | (b[1] << 8)));
      return __fmul_rn(d, static_cast<float>(static_cast<int8_t>(b[2 + c % 32])));
    }
    case WeightFormat::kMXFP4: {
      const uint8_t* b = r + (c / 32) * 17;
      int j = static_cast<int>(c % 32);
      uint32_t code = j < 16 ? (b[1 + j] & 0xf) : (b[1 + j - 16] >> 4);
      return __fmul_rn(DevE2M1ToF32(code), DevE8M0ToF32(b[0]));
    }
    case WeightFormat::kNVFP4: {
      uint8_t byte = r[c / 2];
      uint32_t code = (c & 1) ? (byte >> 4) : (byte & 0xf);
      float s = DevE4M3ToF32(w.scale[row * w.scale_row_stride + c / 16]);
      return __fmul_rn(__fmul_rn(DevE2M1ToF32(code), s), w.scale2);
    }
  }
  return 0.f;
}

}  // namespace moeshard::gpu
