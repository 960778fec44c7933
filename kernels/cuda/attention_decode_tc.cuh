// Internal to the tensor-core decode attention kernels (attention_decode_tc.cu, the fused and
// short-context split kernel; attention_decode_split.cu, the long-context split kernel): the
// mma.sync and ldmatrix wrappers they share, the e4m3 pair conversion, and the end of a CTA of
// four warps that each hold a partial (O, m, l) of the same 16 query rows in the FA2 fragment
// layout — the merge through shared memory and the store.
#pragma once

#include <cuda_fp8.h>

#include <atomic>
#include <cstdint>

#include "kernels/cuda/attention_common.cuh"

namespace moeshard::gpu {

constexpr int kTcRows = 16;  // a KV head's query heads as the rows of one m16 tile

// Shared memory that the four warps' merge (MergeWarpRows) takes: O [4][16][HD], m and l
// [4][16], each row's M [16], floats.
template <int HD>
constexpr int kTcMergeBytes = (4 * kTcRows * HD + 2 * 4 * kTcRows + kTcRows) * 4;

__device__ __forceinline__ void PrefetchL1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

__device__ __forceinline__ void LdMatrixX4(const uint16_t* p, uint32_t (&r)[4]) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void LdMatrixX4T(const uint16_t* p, uint32_t (&r)[4]) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
// c += a b on bf16 operands, or fp16 (F16).
template <bool F16>
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (F16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
template <bool F16>
__device__ __forceinline__ uint32_t Pack(float lo, float hi) {
  if constexpr (F16) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    return static_cast<uint32_t>(DevF32ToBf16(lo)) | (static_cast<uint32_t>(DevF32ToBf16(hi)) << 16);
  }
}
__device__ __forceinline__ float QuadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float QuadSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Two e4m3 bytes as two fp16 in one word (exact).
__device__ __forceinline__ uint32_t E4m3x2ToF16x2(uint32_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// The two e4m3 bytes of half kHalf (0: bits 0-15, 1: bits 16-31) of a word as two fp16 (exact):
// one conversion instruction that reads the half in place, where E4m3x2ToF16x2(v >> 16) costs a
// shift before it.
template <int kHalf>
__device__ __forceinline__ uint32_t E4m3HalfToF16x2(uint32_t v) {
  uint32_t r;
  if constexpr (kHalf == 0) {
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(r) : "r"(v));
  } else {
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}" : "=r"(r) : "r"(v));
  }
  return r;
}

// A warp's 16 scores (S fragments: row lane / 4 (j < 2) or + 8, key 8 n + 2 (lane % 4) + j % 2
// of the warp's 16, the first of them at key0 - 2 (lane % 4)) times `scale` — and, with kscale
// (the warp's 16 FP8 key scales), the key's scale — and -inf outside keys [kb, ke); each row's
// max of them in mx.
template <bool kScaled>
__device__ __forceinline__ void ScaleMaskScores(float (&s)[2][4], int64_t key0, int64_t kb, int64_t ke, float scale,
                                                const float* kscale, int lane, float (&mx)[2]) {
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t key = key0 + n * 8 + (j % 2);
      const bool ok = key >= kb && key < ke;
      float sc = scale;
      if constexpr (kScaled) sc *= kscale[n * 8 + 2 * (lane % 4) + (j % 2)];
      s[n][j] = ok ? s[n][j] * sc : -INFINITY;
      mx[j / 2] = fmaxf(mx[j / 2], s[n][j]);
    }
  }
}

// The probabilities of a warp's 16 scores: P = exp(s - m_use[row]), each row's sum of them in
// sum (unscaled), then — with vscale (the warp's 16 FP8 value scales) — times the key's scale,
// packed as the A fragments of P V.
template <bool F16>
__device__ __forceinline__ void ScoresToP(float (&s)[2][4], const float (&m_use)[2], const float* vscale, int lane,
                                          float (&sum)[2], uint32_t (&pa)[4]) {
  sum[0] = sum[1] = 0.f;
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      s[n][j] = expf(s[n][j] - m_use[j / 2]);
      sum[j / 2] += s[n][j];
    }
  }
  if constexpr (F16) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int j = 0; j < 4; ++j) s[n][j] *= vscale[n * 8 + 2 * (lane % 4) + (j % 2)];
    }
  }
  pa[0] = Pack<F16>(s[0][0], s[0][1]);
  pa[1] = Pack<F16>(s[0][2], s[0][3]);
  pa[2] = Pack<F16>(s[1][0], s[1][1]);
  pa[3] = Pack<F16>(s[1][2], s[1][3]);
}

// O's rows gq and gq + 8 times their correction factors.
template <int HD>
__device__ __forceinline__ void RescaleO(float (&o)[HD / 8][4], const float (&corr)[2]) {
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) {
    o[i][0] *= corr[0];
    o[i][1] *= corr[0];
    o[i][2] *= corr[1];
    o[i][3] *= corr[1];
  }
}

// O += P V for a warp's 16 keys: P as A fragments, V's 16 rows (fp16 or bf16, `ld` elements
// apart, from `vs`) as B fragments by ldmatrix.trans.
template <int HD, bool F16>
__device__ __forceinline__ void PvMma(float (&o)[HD / 8][4], const uint32_t (&pa)[4], const uint16_t* vs, int ld,
                                      int lane) {
#pragma unroll
  for (int d = 0; d < HD / 16; ++d) {
    uint32_t b[4];
    LdMatrixX4T(vs + (lane % 8 + ((lane / 8) % 2) * 8) * ld + d * 16 + (lane / 16) * 8, b);
    Mma<F16>(o[2 * d], pa, b[0], b[1]);
    Mma<F16>(o[2 * d + 1], pa, b[2], b[3]);
  }
}

// The head dim of column n of O's n8 tile i: i * 8 + n, or — kVPairs, the FP8 split kernel's P V,
// whose B fragments come as even and odd dims of 16 at a time (attention_decode_split.cu) — tile
// 4 q + 2 h + odd holds dims 32 q + 16 h + 2 n + odd.
template <bool kVPairs>
__device__ __forceinline__ int TcDim(int i, int n) {
  if constexpr (kVPairs) {
    return (i / 4) * 32 + ((i / 2) % 2) * 16 + 2 * n + (i % 2);
  } else {
    return i * 8 + n;
  }
}

// The four warps' partials of a CTA's query rows, each in shared memory at `smem` as O [warp][row][HD]
// floats then m and l [warp][row] (4 * 16 * HD + 2 * 4 * 16 floats, then 16 more for the merge's
// use: kTcMergeBytes<HD>), merged row by row — each (warp, row)'s weight e^(m - M) computed once —
// and each
// (row, dim) element stored: kToSmem to Po [16][HD] with m and l after it (a cluster's partial),
// else as StoreDecodeHead does (one split: the normalized output; more: the split's workspace
// partial). Every thread calls it after a barrier that follows the warps' writes.
template <int HD, bool kToSmem>
__device__ __forceinline__ void MergeWarpRows(const AttentionParams& p, const DecodeSplit& split, int64_t t, int64_t g,
                                              int group, int64_t sp, int splits, uint8_t* smem, float* Po) {
  constexpr int kRows = kTcRows, kThreads = 128;
  const int tid = threadIdx.x;
  const int64_t H = p.num_heads, hd = p.cache.head_dim;
  const float* Ow = reinterpret_cast<const float*>(smem);
  float* Mw = reinterpret_cast<float*>(smem) + 4 * kRows * HD;  // m, then the weights
  float* Lw = Mw + 4 * kRows;                            // l, then l times the weight
  float* Mr = Lw + 4 * kRows;                            // each row's M
  float* Pm = Po + kRows * HD;
  float* Pl = Pm + kRows;
  // Thread (w, r) < 64: M = the row's largest m of the non-empty partials, its weight e^(m - M)
  // (0 for an empty partial, whose O was never summed into).
  {
    const int w = tid / kRows, r = tid % kRows;
    float M = -INFINITY, f = 0.f, lf = 0.f;
    if (tid < 4 * kRows) {
#pragma unroll
      for (int v = 0; v < 4; ++v) M = fmaxf(M, Lw[v * kRows + r] > 0.f ? Mw[v * kRows + r] : -INFINITY);
      if (const float lw = Lw[tid]; lw > 0.f) {
        f = expf(Mw[tid] - M);
        lf = lw * f;
      }
    }
    __syncthreads();
    if (tid < 4 * kRows) {
      Mw[tid] = f;
      Lw[tid] = lf;
      if (w == 0) Mr[r] = M;
    }
    __syncthreads();
  }
  for (int i = tid; i < group * HD; i += kThreads) {
    const int r = i / HD, d = i % HD;
    if (d >= hd) continue;
    const float M = Mr[r];
    float acc = 0.f, L = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float f = Mw[w * kRows + r];
      if (f != 0.f) {
        acc = fmaf(Ow[(w * kRows + r) * HD + d], f, acc);
        L += Lw[w * kRows + r];
      }
    }
    const int64_t h = g * group + r;
    if constexpr (kToSmem) {
      Po[r * HD + d] = acc;
      if (d == 0) {
        Pm[r] = M;
        Pl[r] = L;
      }
    } else if (splits == 1) {
      uint16_t* out = static_cast<uint16_t*>(p.out) + t * (p.out_stride ? p.out_stride : H * hd) + h * hd;
      StoreF(out + d, L > 0.f ? acc / L : 0.f);
    } else {
      const int64_t w = (t * H + h) * splits + sp;
      split.acc[w * hd + d] = acc;
      if (d == 0) {
        split.m[w] = M;
        split.l[w] = L;
      }
    }
  }
}

// The four warps' partials (o, m, l: rows lane / 4 and lane / 4 + 8 of the m16 tile; O's columns
// as TcDim<kVPairs> maps them) written to shared memory at `smem` and merged by MergeWarpRows
// (every thread calls it after a barrier that frees that memory).
template <int HD, bool kToSmem, bool kVPairs = false>
__device__ __forceinline__ void MergeTcWarps(const AttentionParams& p, const DecodeSplit& split, int64_t t, int64_t g,
                                             int group, int64_t sp, int splits, uint8_t* smem, float* Po,
                                             const float (&o)[HD / 8][4], const float (&m)[2], const float (&l)[2]) {
  constexpr int kRows = kTcRows;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* Ow = reinterpret_cast<float*>(smem);  // [warp][row][HD]
  float* Mw = Ow + 4 * kRows * HD;             // [warp][row]
  float* Lw = Mw + 4 * kRows;
  const int ra = lane / 4, rb = ra + 8;
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) {
    const int d0 = TcDim<kVPairs>(i, 2 * (lane % 4)), d1 = TcDim<kVPairs>(i, 2 * (lane % 4) + 1);
    if constexpr (kVPairs) {
      Ow[(warp * kRows + ra) * HD + d0] = o[i][0];
      Ow[(warp * kRows + ra) * HD + d1] = o[i][1];
      Ow[(warp * kRows + rb) * HD + d0] = o[i][2];
      Ow[(warp * kRows + rb) * HD + d1] = o[i][3];
    } else {
      *reinterpret_cast<float2*>(Ow + (warp * kRows + ra) * HD + d0) = make_float2(o[i][0], o[i][1]);
      *reinterpret_cast<float2*>(Ow + (warp * kRows + rb) * HD + d0) = make_float2(o[i][2], o[i][3]);
    }
  }
  const float la = QuadSum(l[0]), lb = QuadSum(l[1]);
  if (lane % 4 == 0) {
    Mw[warp * kRows + ra] = m[0];
    Mw[warp * kRows + rb] = m[1];
    Lw[warp * kRows + ra] = la;
    Lw[warp * kRows + rb] = lb;
  }
  __syncthreads();
  MergeWarpRows<HD, kToSmem>(p, split, t, g, group, sp, splits, smem, Po);
}

// Resident CTAs an SM of a decode kernel by head size and cache type: query(hd64, fp8, &n) asks
// the occupancy API once and the answer is kept in cache[hd64 * 2 + fp8] (the device's SMs are
// alike); 2, not kept, when it fails, so the next call asks again.
template <typename Query>
int CachedCtasPerSm(std::atomic<int> (&cache)[4], bool hd64, bool fp8, Query query) {
  std::atomic<int>& slot = cache[(hd64 ? 2 : 0) + (fp8 ? 1 : 0)];
  if (const int n = slot.load(std::memory_order_relaxed); n > 0) return n;
  int n = 0;
  if (query(hd64, fp8, &n) != cudaSuccess || n <= 0) {
    cudaGetLastError();
    return 2;
  }
  slot.store(n, std::memory_order_relaxed);
  return n;
}

}  // namespace moeshard::gpu
