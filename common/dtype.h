// Element types of checkpoint tensors and the scalar conversions between them.
// Block-quantized formats (Q8_0, MXFP4, NVFP4) are described here; their row
// expansion lives in kernels/cpu/dequant.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "absl/status/statusor.h"

namespace moeshard {

enum class DType : uint8_t {
  kF32, kF16, kBF16, kF64, kI8, kU8, kI16, kI32, kI64, kBool, kF8E4M3, kF8E5M2,
  kQ8_0,   // GGUF: blocks of 32 int8 with one f16 scale (34 bytes)
  kMXFP4,  // GGUF: blocks of 32 e2m1 with one e8m0 scale (17 bytes)
};

const char* DTypeName(DType t);
absl::StatusOr<DType> DTypeFromSafetensors(std::string_view name);

// Bytes taken by `n` elements (n must be a multiple of the block size for block formats).
absl::StatusOr<uint64_t> DTypeBytes(DType t, uint64_t n);
// Elements per block (1 for plain types).
int DTypeBlock(DType t);

inline float Bf16ToF32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even, NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float F16ToF32Exact(uint16_t h);
// Table lookups (built once): the hot paths expand f16 weights and e4m3 scales per element.
const float* F16Table();
const float* E4M3Table();
inline float F16ToF32(uint16_t h) {
  static const float* t = F16Table();
  return t[h];
}
uint16_t F32ToF16(float f);
float E4M3ToF32Exact(uint8_t v);
inline float E4M3ToF32(uint8_t v) {
  static const float* t = E4M3Table();
  return t[v];
}
uint8_t F32ToE4M3(float f);  // round to nearest even, saturating at 448
float E5M2ToF32(uint8_t v);
// E2M1 (FP4) code: bit 3 sign, bits 0-2 index {0, .5, 1, 1.5, 2, 3, 4, 6}.
extern const float kE2M1Values[16];
// E8M0 scale (MXFP4): 2^(v-127).
float E8M0ToF32(uint8_t v);

}  // namespace moeshard
