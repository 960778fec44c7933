// Tensor-core helpers shared by the decode GEMV (gemv_mma.cu) and the MoE kernels
// (kernels/moe): m16n8k16 bf16 mma with fp32 accumulators, and int8 codes to bf16 exactly.
#pragma once

#include <cstdint>

#include "kernels/cuda/lane_ops.h"

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

// bf16x2 subtract and int8 → bf16 (kernels/cuda/lane_ops.h: host and device alike).
using lane::I8x4ToBf16;
using lane::SubBf16x2;

}  // namespace moeshard::gpu
