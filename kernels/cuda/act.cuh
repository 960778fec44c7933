// Loads and stores of activations as fp32 values, for kernels templated on the
// activation type: float, or uint16_t holding bf16 bits (round to nearest even).
#pragma once

#include "kernels/cuda/weight_decode.cuh"

namespace moeshard::gpu {

template <typename Act>
__device__ __forceinline__ float LoadF(const Act* p) {
  if constexpr (sizeof(Act) == 4) {
    return *p;
  } else {
    return DevBf16ToF32(*p);
  }
}

template <typename Act>
__device__ __forceinline__ void StoreF(Act* p, float v) {
  if constexpr (sizeof(Act) == 4) {
    *p = v;
  } else {
    *p = DevF32ToBf16(v);
  }
}

// 2^x by the special-function unit with denormal results flushed to zero: one instruction, where
// exp2f's handling of denormals costs four (attention's probabilities below 2^-126 do not survive
// the rounding of sums of order one).
__device__ __forceinline__ float Ex2Ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Two floats as one word of two bf16 (lo in the low half), and four as two words.
__device__ __forceinline__ uint32_t PackBf16Pair(float lo, float hi) {
  return static_cast<uint32_t>(DevF32ToBf16(lo)) | (static_cast<uint32_t>(DevF32ToBf16(hi)) << 16);
}
__device__ __forceinline__ uint2 PackBf16x4(float4 v) { return make_uint2(PackBf16Pair(v.x, v.y), PackBf16Pair(v.z, v.w)); }

// a.x² + a.y² + a.z² + a.w², one expression for every kernel that must agree on a row's sum of
// squares bit for bit (the residual update's norm and the GEMV that folds it in).
__device__ __forceinline__ float Sq4(float4 a) { return a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w; }

// Sum over a block of up to 1024 threads (a multiple of 32); every thread gets the total.
__device__ __forceinline__ float BlockSum(float v, float* scratch /* [32] */) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = WarpSum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.f;
  return WarpSum(v);
}

}  // namespace moeshard::gpu
