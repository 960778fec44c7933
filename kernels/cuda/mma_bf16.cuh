// Tensor-core helpers shared by the decode GEMV (gemv_mma.cu) and the MoE kernels
// (kernels/moe): m16n8k16 bf16 mma with fp32 accumulators, and int8 codes to bf16 exactly.
#pragma once

#include <cstdint>

namespace moeshard::gpu {

// d += a · b, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void MmaBf16(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// d = a · b (zero accumulator), m16n8k16, bf16 inputs, fp32 out.
__device__ __forceinline__ void MmaBf16Zero(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%10,%10,%10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.f));
}

__device__ __forceinline__ uint32_t SubBf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// 4 int8 → bf16 pairs (b0, b1) and (b2, b3), exactly. For a byte q = 0x80·s + m (m < 128),
// the bf16 0x43·m is 128 + m and 0x43·(0x80·s) is 128 or 256: their difference is q.
__device__ __forceinline__ void I8x4ToBf16(uint32_t q, uint32_t& lo, uint32_t& hi) {
  const uint32_t m = q & 0x7F7F7F7Fu, s = q & 0x80808080u;
  lo = SubBf16x2(__byte_perm(m, 0x43434343u, 0x4140), __byte_perm(s, 0x43434343u, 0x4140));
  hi = SubBf16x2(__byte_perm(m, 0x43434343u, 0x4342), __byte_perm(s, 0x43434343u, 0x4342));
}

}  // namespace moeshard::gpu
