// One warp's q/k preparation of one head, shared by QkPrep (qk_prep.cu) and the fused decode
// attention (attention_decode_tc.cu), so that both compute bit-identical values: lane l holds
// elements l, l + 32, ... of the head (the rotate-half partners i and i + head_dim / 2 sit in
// the same lane); the RoPE angles of a position are computed in double, as the CPU reference
// does, into shared memory ([half] cos, then [half] sin).
#pragma once

#include <cuda_fp8.h>

#include "kernels/cuda/act.cuh"

namespace moeshard::gpu {

inline constexpr int kQkMaxPer = 8;  // head_dim / 32, head_dim <= 256

template <typename Act>
__device__ __forceinline__ void QkLoadHead(const Act* src, int per, int lane, float (&x)[kQkMaxPer]) {
#pragma unroll
  for (int j = 0; j < kQkMaxPer; ++j) x[j] = j < per ? LoadF(src + lane + 32 * j) : 0.f;
}

// cs[i] = cos(pos / theta^(2i / hd)), cs[half + i] = sin(...), i < half: threads tid, tid + n, ...
__device__ __forceinline__ void QkRopeAngles(int64_t pos, double theta, int64_t hd, float* cs, int tid, int n) {
  const int64_t half = hd / 2;
  for (int64_t i = tid; i < half; i += n) {
    const double a = static_cast<double>(pos) / pow(theta, static_cast<double>(2 * i) / static_cast<double>(hd));
    cs[i] = static_cast<float>(cos(a));
    cs[half + i] = static_cast<float>(sin(a));
  }
}

// x <- x / rms(x) * w (RMSNorm over the head).
__device__ __forceinline__ void QkNorm(float (&x)[kQkMaxPer], int per, int lane, const float* w, int64_t hd, float eps) {
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kQkMaxPer; ++j) ss = fmaf(x[j], x[j], ss);
  const float inv = rsqrtf(WarpSum(ss) / static_cast<float>(hd) + eps);
#pragma unroll
  for (int j = 0; j < kQkMaxPer; ++j) x[j] = j < per ? x[j] * inv * w[lane + 32 * j] : 0.f;
}

// Rotate-half RoPE with the angles in cs.
__device__ __forceinline__ void QkRope(float (&x)[kQkMaxPer], int per, int lane, const float* cs, int64_t half) {
  const int hp = per / 2;  // pairs (j, j + hp)
#pragma unroll
  for (int j = 0; j < kQkMaxPer / 2; ++j) {
    if (j < hp) {
      const int64_t i = lane + 32 * j;
      const float c = cs[i], s = cs[half + i], x0 = x[j], x1 = x[j + hp];
      x[j] = x0 * c - x1 * s;
      x[j + hp] = x1 * c + x0 * s;
    }
  }
}

// One head's row of the KV cache at element dst (FP8: its scale at scale_at).
template <KvElem E>
__device__ __forceinline__ void QkStoreKv(void* base, float* scales, int64_t dst, int64_t scale_at, int per, int lane,
                                          const float (&x)[kQkMaxPer]) {
  if constexpr (E == KvElem::kFp8E4M3) {
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < kQkMaxPer; ++j) amax = j < per ? fmaxf(amax, fabsf(x[j])) : amax;
    amax = WarpMax(amax);
    const float scale = amax > 0.f ? amax / 448.f : 1.f;
#pragma unroll
    for (int j = 0; j < kQkMaxPer; ++j) {
      if (j < per) {
        static_cast<uint8_t*>(base)[dst + lane + 32 * j] =
            static_cast<uint8_t>(__nv_cvt_float_to_fp8(x[j] / scale, __NV_SATFINITE, __NV_E4M3));
      }
    }
    if (lane == 0) scales[scale_at] = scale;
  } else if constexpr (E == KvElem::kBF16) {
#pragma unroll
    for (int j = 0; j < kQkMaxPer; ++j) {
      if (j < per) static_cast<uint16_t*>(base)[dst + lane + 32 * j] = DevF32ToBf16(x[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kQkMaxPer; ++j) {
      if (j < per) static_cast<float*>(base)[dst + lane + 32 * j] = x[j];
    }
  }
}

}  // namespace moeshard::gpu
