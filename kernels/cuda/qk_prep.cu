// QkPrep (gpu_params.h): one warp per (token, head) task — the token's query heads, then its
// key heads (each also storing the value head of the same index). Lane l holds elements
// l, l + 32, ... of the head, so the rotate-half partners i and i + head_dim / 2 sit in the
// same lane. The token's RoPE angles are computed once per block, in double as the CPU
// reference does, into shared memory. Grid: (tokens, blocks of kWarps tasks).
#include <cuda_fp8.h>

#include "kernels/cuda/act.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/qk_prep.cuh"

namespace moeshard::gpu {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxPer = kQkMaxPer;

template <typename Act, KvElem E>
__global__ void __launch_bounds__(kWarps * 32) QkPrepKernel(QkPrepParams p) {
  extern __shared__ float cs[];  // [half] cos, then [half] sin
  const int64_t t = blockIdx.x, hd = p.cache.head_dim, half = hd / 2, nkv = p.cache.num_kv_heads;
  const int per = static_cast<int>(hd / 32), lane = threadIdx.x % 32;
  // The angles depend on the step's positions only (uploaded before the step): before the wait.
  if (p.rope) QkRopeAngles(p.pos[t], p.theta, hd, cs, threadIdx.x, blockDim.x);
  PdlWait();
  PdlTrigger();
  if (p.rope) __syncthreads();
  const int64_t task = static_cast<int64_t>(blockIdx.y) * kWarps + threadIdx.x / 32;
  if (task >= p.num_heads + nkv) return;
  const bool is_q = task < p.num_heads;
  const int64_t h = is_q ? task : task - p.num_heads;
  const Act* src = is_q ? static_cast<const Act*>(p.q) + (t * p.num_heads + h) * hd
                        : static_cast<const Act*>(p.k) + (t * nkv + h) * hd;
  float x[kMaxPer];
  QkLoadHead(src, per, lane, x);
  const float* nw = is_q ? p.q_norm : p.k_norm;
  if (nw) QkNorm(x, per, lane, nw, hd, p.eps);
  if (p.rope) QkRope(x, per, lane, cs, half);
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
  QkStoreKv<E>(p.cache.k, p.cache.k_scale, dst, slot * nkv + h, per, lane, x);
  QkLoadHead(static_cast<const Act*>(p.v) + (t * nkv + h) * hd, per, lane, x);
  QkStoreKv<E>(p.cache.v, p.cache.v_scale, dst, slot * nkv + h, per, lane, x);
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
