// Internal to the wgmma attention (attention_wgmma.cu, attention_wgmma_ws.cu): the tile
// shapes, the swizzled shared-memory placement, and one warpgroup's work on one key tile
// (S = Q Kᵀ, masks and online softmax, O += P V) and its output rows. sm_90a only.
#pragma once

#include <climits>
#include <cstdint>

#include "kernels/cuda/act.cuh"
#include "kernels/cuda/gpu_params.h"
#include "kernels/cuda/wgmma.cuh"

namespace moeshard::gpu {

// 128 query rows a CTA (two warpgroups of 64), key tiles of 128.
constexpr int kWgRows = 128, kWgKeys = 128;

// A launch's shape: one CTA per (tile of 128 / group consecutive tokens, KV head).
struct WgGrid {
  dim3 grid;
  int group = 1, tile_tokens = 1;
};
inline WgGrid WgLaunchGrid(const AttentionParams& p) {
  WgGrid w;
  w.group = static_cast<int>(p.num_heads / p.cache.num_kv_heads);
  w.tile_tokens = kWgRows / w.group;
  w.grid = dim3(static_cast<unsigned>((p.num_tokens + w.tile_tokens - 1) / w.tile_tokens),
                static_cast<unsigned>(p.cache.num_kv_heads));
  return w;
}

// Byte offset of 16-byte chunk c (of head_dim / 8) of row r in a [head_dim/64][rows][64] bf16 tile
// in the 128-byte swizzle (wgmma.cuh).
__device__ __forceinline__ uint32_t SwizzledChunk(int r, int c, int rows) {
  return static_cast<uint32_t>((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// One warp: the keys the CTA's 128 rows see, [first, last] into range[0], and each warpgroup's
// 64 rows' into range[1] and range[2] (INT_MAX, -1 where no row is valid), with [2] the latest
// first key and [3] the earliest position of its valid rows: a key tile inside [range[2],
// range[3]] is visible to every row, so it needs no mask.
__device__ __forceinline__ void WgKeyRanges(const int* rpos, const int* rfirst, int lane, int (*range)[4]) {
  int lo_all = INT_MAX, hi_all = -1;
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    int lo = INT_MAX, hi = -1, first_max = -1, pos_min = INT_MAX;
    for (int r = w * 64 + lane; r < w * 64 + 64; r += 32) {
      lo = min(lo, rfirst[r]);
      hi = max(hi, rpos[r]);
      if (rpos[r] >= 0) {
        first_max = max(first_max, rfirst[r]);
        pos_min = min(pos_min, rpos[r]);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
      hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
      first_max = max(first_max, __shfl_xor_sync(0xffffffffu, first_max, o));
      pos_min = min(pos_min, __shfl_xor_sync(0xffffffffu, pos_min, o));
    }
    if (lane == 0) {
      range[1 + w][0] = lo;
      range[1 + w][1] = hi;
      range[1 + w][2] = first_max;
      range[1 + w][3] = pos_min;
    }
    lo_all = min(lo_all, lo);
    hi_all = max(hi_all, hi);
  }
  if (lane == 0) {
    range[0][0] = lo_all;
    range[0][1] = hi_all;
  }
}

// Two floats to bf16 by round-to-nearest-even in one instruction: the bits PackBf16Pair computes in
// seven integer operations a value, for every value that is not NaN (P never is).
__device__ __forceinline__ uint32_t PackBf16PairRn(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// One warpgroup's 64 query rows against key tiles of 128, in steps a caller interleaves so that
// one tile's softmax runs while the tensor cores work on the next tile's scores and the previous
// tile's P V (FA3's overlap inside a warpgroup) and so that the warpgroups can take turns issuing:
//   WgIssueScores  S = Q Kᵀ (q_addr, k_addr: shared addresses of its Q rows and the tile's K,
//                  swizzled, 1,024-byte aligned), committed as one wgmma group;
//   WgMask         keys outside a row's [first, pos] to -inf (only tiles some row sees partly);
//   WgSoftmax      the online softmax in place: S becomes exp2(S scale_log2 - m), m and l move
//                  on, corr is what the rows' earlier O must be multiplied by;
//   WgPackP        S into P as bf16 pairs, the A operand of WgIssuePv;
//   WgIssuePv      O += P V (v_addr: the tile's V), committed as one group.
// The thread holds rows gq and gq + 8 of each warp's 16 (positions pos, first visible keys
// first); S and O are wgmma accumulator fragments (column 8 n + 2 tq + e of row h at
// [4 n + 2 h + e]); m is the running maximum of scores times scale_log2 (= scale * log2 e), l this
// thread's part of the running sum. Each wgmma sits on a path every thread of the warpgroup
// takes: one the compiler cannot prove warp-uniform is serialized (ptxas C7518).
template <int HD>
__device__ __forceinline__ void WgIssueScores(float (&s)[kWgKeys / 2], uint32_t q_addr, uint32_t k_addr) {
  WgmmaFence();
#pragma unroll
  for (int ks = 0; ks < HD / 16; ++ks) {
    const uint32_t kof = (ks % 4) * 32u;  // 16 elements of K further into the 128-byte rows
    const uint64_t da = WgmmaDesc(q_addr + (ks / 4) * (kWgRows * 128) + kof, 16, 1024);
    const uint64_t db = WgmmaDesc(k_addr + (ks / 4) * (kWgKeys * 128) + kof, 16, 1024);
    WgmmaSS128(s, da, db, ks > 0 ? 1 : 0);
  }
  WgmmaCommit();
}

__device__ __forceinline__ void WgMask(float (&s)[kWgKeys / 2], int k0, const int (&pos)[2], const int (&first)[2],
                                       int tq) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int n = 0; n < kWgKeys / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int kp = k0 + n * 8 + 2 * tq + e;
        if (kp > pos[h] || kp < first[h]) s[4 * n + 2 * h + e] = -INFINITY;
      }
    }
  }
}

__device__ __forceinline__ void WgSoftmax(float (&s)[kWgKeys / 2], float (&m)[2], float (&l)[2], float (&corr)[2],
                                          float scale_log2) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < kWgKeys / 8; ++n) mx = fmaxf(mx, fmaxf(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[h], mx * scale_log2);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    corr[h] = Ex2Ftz(m[h] - m_use);
    float psum = 0.f;
#pragma unroll
    for (int n = 0; n < kWgKeys / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * n + 2 * h + e];
        x = Ex2Ftz(fmaf(x, scale_log2, -m_use));
        psum += x;
      }
    }
    l[h] = l[h] * corr[h] + psum;
    m[h] = m_new;
  }
}

// P as bf16 pairs: [block of 8 keys][0] row gq, [1] row gq + 8.
__device__ __forceinline__ void WgPackP(const float (&s)[kWgKeys / 2], uint32_t (&pk)[kWgKeys / 8][2]) {
#pragma unroll
  for (int n = 0; n < kWgKeys / 8; ++n) {
#pragma unroll
    for (int h = 0; h < 2; ++h) pk[n][h] = PackBf16PairRn(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]);
  }
}

template <int HD>
__device__ __forceinline__ void WgRescale(float (&o)[HD / 2], const float (&corr)[2]) {
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      o[4 * n + 2 * h] *= corr[h];
      o[4 * n + 2 * h + 1] *= corr[h];
    }
  }
}

template <int HD>
__device__ __forceinline__ void WgIssuePv(float (&o)[HD / 2], const uint32_t (&pk)[kWgKeys / 8][2], uint32_t v_addr) {
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kWgKeys / 16; ++kk) {
    const uint64_t db = WgmmaDesc(v_addr + kk * 2048, kWgKeys * 128, 1024);
    if constexpr (HD == 128) {
      WgmmaRS128TransB(o, pk[2 * kk][0], pk[2 * kk][1], pk[2 * kk + 1][0], pk[2 * kk + 1][1], db, 1);
    } else {
      WgmmaRS64TransB(o, pk[2 * kk][0], pk[2 * kk][1], pk[2 * kk + 1][0], pk[2 * kk + 1][1], db, 1);
    }
  }
  WgmmaCommit();
}

// Keeps P's registers live (and unchanged) until a wait has seen the wgmma that reads them.
__device__ __forceinline__ void WgPinP(uint32_t (&pk)[kWgKeys / 8][2]) {
#pragma unroll
  for (int n = 0; n < kWgKeys / 8; ++n) asm volatile("" : "+r"(pk[n][0]), "+r"(pk[n][1])::"memory");
}

// The thread's two output rows (row0 and row0 + 8 of the CTA's 128): O / l in bf16; rows with
// pos < 0 (past the run) are not written.
template <int HD>
__device__ __forceinline__ void WgStoreRows(const AttentionParams& p, const float (&o)[HD / 2], const float (&l)[2],
                                            const int (&pos)[2], int row0, int64_t s0, int group, int64_t g,
                                            int tq) {
  const int64_t o_stride = p.out_stride ? p.out_stride : p.num_heads * HD;
  uint16_t* obase = static_cast<uint16_t*>(p.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float L = l[h];
    L += __shfl_xor_sync(0xffffffffu, L, 1);
    L += __shfl_xor_sync(0xffffffffu, L, 2);
    if (pos[h] < 0) continue;
    const int r = row0 + 8 * h;
    const int64_t t = s0 + r / group;
    uint16_t* out = obase + t * o_stride + (g * group + r % group) * HD;
    const float inv = L > 0.f ? 1.f / L : 0.f;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      *reinterpret_cast<uint32_t*>(out + n * 8 + 2 * tq) = PackBf16Pair(o[4 * n + 2 * h] * inv, o[4 * n + 2 * h + 1] * inv);
    }
  }
}

}  // namespace moeshard::gpu
