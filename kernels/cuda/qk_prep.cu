// QkPrep (gpu_params.h): one warp per (token, head) task — the token's query heads, then its
// key heads (each also storing the value head of the same index). Lane l holds elements
// l, l + 32, ... of the head, so the rotate-half partners i and i + head_dim / 2 sit in the
// same lane. The token's RoPE angles are computed once per block, in double as the CPU
// reference does, into shared memory. Grid: (tokens, blocks of kWarps tasks).
#include <cuda_fp8.h>

#include "kernels/cuda/act.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/pdl.cuh"

namespace moeshard::gpu {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxPer = 8;  // head_dim / 32, head_dim ≤ 256

template <typename Act>
__device__ __forceinline__ void LoadHead(const Act* src, int per, int lane, float (&x)[kMaxPer]) {
#pragma unroll
  for (int j = 0; j < kMaxPer; ++j) x[j] = j < per ? LoadF(src + lane + 32 * j) : 0.f;
}

template <KvElem E>
__device__ __forceinline__ void StoreKv(void* base, float* scales, int64_t dst, int64_t scale_at, int per, int lane,
                                        const float (&x)[kMaxPer]) {
  if constexpr (E == KvElem::kFp8E4M3) {
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < kMaxPer; ++j) amax = j < per ? fmaxf(amax, fabsf(x[j])) : amax;
    amax = WarpMax(amax);
    const float scale = amax > 0.f ? amax / 448.f : 1.f;
#pragma unroll
    for (int j = 0; j < kMaxPer; ++j) {
      if (j < per) {
        static_cast<uint8_t*>(base)[dst + lane + 32 * j] =
            static_cast<uint8_t>(__nv_cvt_float_to_fp8(x[j] / scale, __NV_SATFINITE, __NV_E4M3));
      }
    }
    if (lane == 0) scales[scale_at] = scale;
  } else if constexpr (E == KvElem::kBF16) {
#pragma unroll
    for (int j = 0; j < kMaxPer; ++j) {
      if (j < per) static_cast<uint16_t*>(base)[dst + lane + 32 * j] = DevF32ToBf16(x[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kMaxPer; ++j) {
      if (j < per) static_cast<float*>(base)[dst + lane + 32 * j] = x[j];
    }
  }
}

template <typename Act, KvElem E>
__global__ void __launch_bounds__(kWarps * 32) QkPrepKernel(QkPrepParams p) {
  extern __shared__ float cs[];  // [half] cos, then [half] sin
  PdlWait();
  PdlTrigger();
  const int64_t t = blockIdx.x, hd = p.cache.head_dim, half = hd / 2, nkv = p.cache.num_kv_heads;
  const int per = static_cast<int>(hd / 32), lane = threadIdx.x % 32;
  if (p.rope) {
    const double pos = p.pos[t];
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      const double a = pos / pow(p.theta, static_cast<double>(2 * i) / static_cast<double>(hd));
      cs[i] = static_cast<float>(cos(a));
      cs[half + i] = static_cast<float>(sin(a));
    }
    __syncthreads();
  }
  const int64_t task = static_cast<int64_t>(blockIdx.y) * kWarps + threadIdx.x / 32;
  if (task >= p.num_heads + nkv) return;
  const bool is_q = task < p.num_heads;
  const int64_t h = is_q ? task : task - p.num_heads;
  const Act* src = is_q ? static_cast<const Act*>(p.q) + (t * p.num_heads + h) * hd
                        : static_cast<const Act*>(p.k) + (t * nkv + h) * hd;
  float x[kMaxPer];
  LoadHead(src, per, lane, x);
  const float* nw = is_q ? p.q_norm : p.k_norm;
  if (nw) {
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < kMaxPer; ++j) ss = fmaf(x[j], x[j], ss);
    const float inv = rsqrtf(WarpSum(ss) / static_cast<float>(hd) + p.eps);
#pragma unroll
    for (int j = 0; j < kMaxPer; ++j) x[j] = j < per ? x[j] * inv * nw[lane + 32 * j] : 0.f;
  }
  if (p.rope) {
    const int hp = per / 2;  // pairs (j, j + hp)
#pragma unroll
    for (int j = 0; j < kMaxPer / 2; ++j) {
      if (j < hp) {
        const int64_t i = lane + 32 * j;
        const float c = cs[i], s = cs[half + i], x0 = x[j], x1 = x[j + hp];
        x[j] = x0 * c - x1 * s;
        x[j + hp] = x1 * c + x0 * s;
      }
    }
  }
  if (is_q) {
    Act* dst = static_cast<Act*>(p.q) + (t * p.num_heads + h) * hd;
#pragma unroll
    for (int j = 0; j < kMaxPer; ++j) {
      if (j < per) StoreF(dst + lane + 32 * j, x[j]);
    }
    return;
  }
  const int64_t slot = p.slots[t];
  const int64_t dst = (slot * nkv + h) * hd;
  StoreKv<E>(p.cache.k, p.cache.k_scale, dst, slot * nkv + h, per, lane, x);
  LoadHead(static_cast<const Act*>(p.v) + (t * nkv + h) * hd, per, lane, x);
  StoreKv<E>(p.cache.v, p.cache.v_scale, dst, slot * nkv + h, per, lane, x);
}

template <typename Act>
cudaError_t LaunchAct(const QkPrepParams& p, cudaStream_t st) {
  const int64_t tasks = p.num_heads + p.cache.num_kv_heads;
  dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>((tasks + kWarps - 1) / kWarps));
  const size_t smem = p.rope ? static_cast<size_t>(p.cache.head_dim) * sizeof(float) : 0;
  switch (p.cache.elem) {
    case KvElem::kF32: return LaunchPdl(QkPrepKernel<Act, KvElem::kF32>, grid, kWarps * 32, smem, st, p);
    case KvElem::kBF16: return LaunchPdl(QkPrepKernel<Act, KvElem::kBF16>, grid, kWarps * 32, smem, st, p);
    case KvElem::kFp8E4M3: return LaunchPdl(QkPrepKernel<Act, KvElem::kFp8E4M3>, grid, kWarps * 32, smem, st, p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchQkPrep(const QkPrepParams& p, cudaStream_t st) {
  return p.dtype == ActDType::kF32 ? LaunchAct<float>(p, st) : LaunchAct<uint16_t>(p, st);
}

}  // namespace moeshard::gpu
