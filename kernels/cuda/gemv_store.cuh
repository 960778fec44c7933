// The GEMV kernels' output store: y[tok, row] = s (+ bias[row]), fp32 or rounded once to bf16.
#pragma once

#include <cstdint>

#include "kernels/cuda/gemv.h"
#include "kernels/cuda/weight_decode.cuh"

namespace moeshard::gpu {

__device__ __forceinline__ void GemvStoreY(const GemvMatrix& m, int y_f32, int64_t row, int64_t tok, float s) {
  const float y = m.bias ? s + m.bias[row] : s;
  const int64_t at = tok * m.y_stride + row;
  if (y_f32) {
    static_cast<float*>(m.y)[at] = y;
  } else {
    static_cast<uint16_t*>(m.y)[at] = DevF32ToBf16(y);
  }
}

}  // namespace moeshard::gpu
