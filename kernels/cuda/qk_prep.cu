// QkPrep (gpu_params.h): one warp per (token, head) task — the token's query heads, then its
// key heads (each also storing the value head of the same index). Lane l holds elements
// l, l + 32, ... of the head, so the rotate-half partners i and i + head_dim / 2 sit in the
// same lane. The token's RoPE angles are computed once per block, in double as the CPU
// reference does, into shared memory. Grid: (tokens, blocks of kWarps tasks).
#include <cuda_fp8.h>

#include <cstdlib>

#include "kernels/cuda/act.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/qk_prep.cuh"

namespace moeshard::gpu {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxPer = kQkMaxPer;
constexpr int64_t kOneBlockTokens = 256;  // steps of this many tokens take a block a token

// MOESHARD_QK_PREP_TOKEN=0: large steps through the generic kernel (for comparing the two).
bool TokenKernelOn() {
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_QK_PREP_TOKEN");
    return !(v && v[0] == '0');
  }();
  return on;
}

template <typename Act, KvElem E>
__device__ __forceinline__ void PrepTask(const QkPrepParams& p, int64_t t, int64_t task, int per, int lane,
                                         const float* cs) {
  const int64_t hd = p.cache.head_dim, half = hd / 2, nkv = p.cache.num_kv_heads;
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

template <typename Act, KvElem E>
__global__ void __launch_bounds__(kWarps * 32) QkPrepKernel(QkPrepParams p) {
  extern __shared__ float cs[];  // [half] cos, then [half] sin
  const int64_t t = blockIdx.x, hd = p.cache.head_dim, nkv = p.cache.num_kv_heads;
  const int per = static_cast<int>(hd / 32), lane = threadIdx.x % 32;
  // The angles depend on the step's positions only (uploaded before the step): before the wait.
  if (p.rope) QkRopeAngles(p.pos[t], p.theta, hd, cs, threadIdx.x, blockDim.x);
  PdlWait();
  PdlTrigger();
  if (p.rope) __syncthreads();
  // Block y's warps take tasks y·kWarps + warp, then every gridDim.y·kWarps after it: a prefill's
  // grid has one block a token (its angles computed once for all of the token's heads), a
  // decode step's enough blocks for one task a warp.
  for (int64_t task = static_cast<int64_t>(blockIdx.y) * kWarps + threadIdx.x / 32; task < p.num_heads + nkv;
       task += static_cast<int64_t>(gridDim.y) * kWarps) {
    PrepTask<Act, E>(p, t, task, per, lane, cs);
  }
}

// Prefill-sized steps: one block a token, head_dim a compile-time 32·PER, the norm weights and the
// token's cos/sin for a lane's elements held in registers for all of a warp's tasks. The same
// arithmetic in the same order as PrepTask (qk_prep_test's 256- and 300-token cases check it
// against the CPU reference; it has not been compared bit for bit with PrepTask): what goes is the per-task
// predication on a run-time head size, the weights' and angles' reloads and 64-bit index math —
// the generic kernel issued ~330 warp instructions a task (ncu, 2026-12-04: 109 µs a 4,096-token
// layer of the Qwen3-30B shape at 60 % issue-slot use for ~83 MB).
template <typename Act, KvElem E, int PER>
__global__ void __launch_bounds__(kWarps * 32) QkPrepTokenKernel(QkPrepParams p) {
  constexpr int hd = 32 * PER, half = hd / 2, HP = PER / 2;
  __shared__ float cs[hd];  // [half] cos, then [half] sin
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int nq = static_cast<int>(p.num_heads), nkv = static_cast<int>(p.cache.num_kv_heads);
  if (p.rope) QkRopeAngles(p.pos[t], p.theta, hd, cs, threadIdx.x, blockDim.x);
  float qw[PER], kw[PER];
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    qw[j] = p.q_norm ? p.q_norm[lane + 32 * j] : 1.f;
    kw[j] = p.k_norm ? p.k_norm[lane + 32 * j] : 1.f;
  }
  const int64_t slot = p.slots[t];
  PdlWait();
  PdlTrigger();
  float c[HP > 0 ? HP : 1], sn[HP > 0 ? HP : 1];
  if (p.rope) {
    __syncthreads();
#pragma unroll
    for (int j = 0; j < HP; ++j) c[j] = cs[lane + 32 * j], sn[j] = cs[half + lane + 32 * j];
  }
  for (int task = warp; task < nq + nkv; task += kWarps) {
    const bool is_q = task < nq;
    const int h = is_q ? task : task - nq;
    const Act* src =
        is_q ? static_cast<const Act*>(p.q) + (t * nq + h) * hd : static_cast<const Act*>(p.k) + (t * nkv + h) * hd;
    float x[PER], v[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) x[j] = LoadF(src + lane + 32 * j);
    if (!is_q) {
      const Act* vs = static_cast<const Act*>(p.v) + (t * nkv + h) * hd;
#pragma unroll
      for (int j = 0; j < PER; ++j) v[j] = LoadF(vs + lane + 32 * j);
    }
    if (p.q_norm) {  // QkNorm's sums and products
      float ss = 0.f;
#pragma unroll
      for (int j = 0; j < PER; ++j) ss = fmaf(x[j], x[j], ss);
      const float inv = rsqrtf(WarpSum(ss) / static_cast<float>(hd) + p.eps);
#pragma unroll
      for (int j = 0; j < PER; ++j) x[j] = x[j] * inv * (is_q ? qw[j] : kw[j]);
    }
    if (p.rope) {  // QkRope's
#pragma unroll
      for (int j = 0; j < HP; ++j) {
        const float x0 = x[j], x1 = x[j + HP];
        x[j] = x0 * c[j] - x1 * sn[j];
        x[j + HP] = x1 * c[j] + x0 * sn[j];
      }
    }
    if (is_q) {
      Act* dst = static_cast<Act*>(p.q) + (t * nq + h) * hd;
#pragma unroll
      for (int j = 0; j < PER; ++j) StoreF(dst + lane + 32 * j, x[j]);
      continue;
    }
    float xk[kMaxPer], xv[kMaxPer];
#pragma unroll
    for (int j = 0; j < kMaxPer; ++j) xk[j] = j < PER ? x[j] : 0.f, xv[j] = j < PER ? v[j] : 0.f;
    const int64_t dst = (slot * nkv + h) * hd;
    QkStoreKv<E>(p.cache.k, p.cache.k_scale, dst, slot * nkv + h, PER, lane, xk);
    QkStoreKv<E>(p.cache.v, p.cache.v_scale, dst, slot * nkv + h, PER, lane, xv);
  }
}

template <typename Act, int PER>
cudaError_t LaunchToken(const QkPrepParams& p, cudaStream_t st) {
  const dim3 grid(static_cast<unsigned>(p.num_tokens));
  switch (p.cache.elem) {
    case KvElem::kF32: return LaunchPdl(QkPrepTokenKernel<Act, KvElem::kF32, PER>, grid, kWarps * 32, 0, st, p);
    case KvElem::kBF16: return LaunchPdl(QkPrepTokenKernel<Act, KvElem::kBF16, PER>, grid, kWarps * 32, 0, st, p);
    case KvElem::kFp8E4M3: return LaunchPdl(QkPrepTokenKernel<Act, KvElem::kFp8E4M3, PER>, grid, kWarps * 32, 0, st, p);
  }
  return cudaGetLastError();
}

template <typename Act>
cudaError_t LaunchAct(const QkPrepParams& p, cudaStream_t st) {
  const int64_t tasks = p.num_heads + p.cache.num_kv_heads;
  if (p.num_tokens >= kOneBlockTokens && TokenKernelOn()) {
    if (p.cache.head_dim == 128) return LaunchToken<Act, 4>(p, st);
    if (p.cache.head_dim == 64) return LaunchToken<Act, 2>(p, st);
  }
  // Smaller steps (and other head sizes): one task a warp; a large step's blocks one a token.
  const unsigned ny = p.num_tokens >= kOneBlockTokens ? 1u : static_cast<unsigned>((tasks + kWarps - 1) / kWarps);
  dim3 grid(static_cast<unsigned>(p.num_tokens), ny);
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
