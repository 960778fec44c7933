// Internal to the attention kernels (attention*.cu): reading the paged KV cache four
// elements at a time, converted to fp32 exactly as the first kernel did one at a time, and
// the per-run bookkeeping the tiled kernels share (block-table runs, row positions).
#pragma once

#include <climits>

#include <cuda_fp8.h>

#include <atomic>
#include <cstdint>

#include "kernels/cuda/act.cuh"
#include "kernels/cuda/launchers.h"

namespace moeshard::gpu {

// Elements [idx, idx + 4) of a cache tensor (idx a multiple of 4, the base 16-byte aligned)
// as fp32; FP8 values times the (slot, head) scale at scale_idx.
template <KvElem E>
__device__ __forceinline__ float4 LoadKv4(const void* base, const float* scales, int64_t idx, int64_t scale_idx) {
  if constexpr (E == KvElem::kF32) {
    return *reinterpret_cast<const float4*>(static_cast<const float*>(base) + idx);
  } else if constexpr (E == KvElem::kBF16) {
    const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(base) + idx);
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
  } else {
    // The hardware conversion, two values an instruction (e4m3 -> fp16 and fp16 -> fp32 are
    // exact: the same values as DevE4M3ToF32, NaN for the NaN code).
    const uint32_t u = *reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(base) + idx);
    const float s = scales[scale_idx];
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u >> 16), __NV_E4M3);
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    return make_float4(a.x * s, a.y * s, b.x * s, b.y * s);
  }
}

__device__ __forceinline__ int WarpMinInt(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ int WarpMaxInt(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Tokens [s0, s1) of a tile that share token s0's block table (one sequence's chunk): s1.
__device__ __forceinline__ int64_t SameTableEnd(const AttentionParams& p, int64_t s0, int64_t t_end) {
  const int32_t toff = p.table_offset[s0];
  int64_t s1 = s0 + 1;
  while (s1 < t_end && p.table_offset[s1] == toff) ++s1;
  return s1;
}

// A paged cache's slot of key position kp, without 64-bit division (a software routine of
// dozens of dependent instructions a key in the kernels' copy loops): positions and block
// numbers fit in 32 bits, and a power-of-two block size (what the runners make) is a shift and
// a mask.
struct PagedSlots {
  const int32_t* table;
  int bs, shift;  // shift < 0: a block size that is not a power of two
  __device__ __forceinline__ PagedSlots(const int32_t* t, int64_t block_size) : table(t), bs(static_cast<int>(block_size)) {
    int s = 0;
    while (s < 30 && (1 << s) < bs) ++s;
    shift = (1 << s) == bs ? s : -1;
  }
  __device__ __forceinline__ int64_t operator()(int64_t kp) const {
    const int k = static_cast<int>(kp);
    const int b = shift >= 0 ? k >> shift : k / bs;
    return static_cast<int64_t>(table[b]) * bs + (k - b * bs);
  }
};

// The query rows of a run: row r is head r % group of token s0 + r / group. Threads
// tid < rows store each row's position and first visible key (INT_MAX / -1 for rows
// past the run or the tile) for the causal and sliding-window masks.
__device__ __forceinline__ void StoreRowPositions(const AttentionParams& p, int64_t s0, int64_t s1, int group,
                                                  int rows_used, int rows, int tid, int* rpos, int* rfirst) {
  if (tid < rows) {
    const int64_t t = s0 + tid / group;
    int ps = -1, fs = INT_MAX;
    if (tid < rows_used && t < s1) {
      ps = p.pos[t];
      fs = p.window > 0 ? static_cast<int>(max(int64_t{0}, ps - p.window + 1)) : 0;
    }
    rpos[tid] = ps;
    rfirst[tid] = fs;
  }
}

// The split-decode kernels' bookkeeping (attention_decode*.cu): split sp of token t's visible
// keys is [kb, ke) — ranges of at least p.split_min_keys keys (64 unless
// MOESHARD_ATTN_SPLIT_KEYS says more), multiples of 32 — and its partials go to the
// workspace: acc [tokens * heads * splits, head_dim], then m and l [tokens * heads * splits].
struct DecodeSplit {
  int64_t kb = 0, ke = 0;
  float *acc = nullptr, *m = nullptr, *l = nullptr;
};

__device__ __forceinline__ DecodeSplit DecodeSplitOf(const AttentionParams& p, int64_t t, int64_t sp, int splits,
                                                     float* ws) {
  const int64_t pos = p.pos[t];
  const int64_t first = p.window > 0 ? max(int64_t{0}, pos - p.window + 1) : 0;
  int64_t sz = (pos - first + 1 + splits - 1) / splits;
  sz = max(p.split_min_keys, (sz + 31) / 32 * 32);
  DecodeSplit s;
  s.kb = first + sp * sz;
  s.ke = min(pos + 1, s.kb + sz);
  const int64_t total = p.num_tokens * p.num_heads * splits;
  s.acc = ws;
  s.m = ws ? ws + total * p.cache.head_dim : nullptr;
  s.l = ws ? s.m + total : nullptr;
  return s;
}

// An empty split (a short context): threads tid < group mark their head's partial for the combine.
__device__ __forceinline__ void MarkEmptySplit(const AttentionParams& p, const DecodeSplit& s, int64_t t, int64_t g,
                                               int group, int64_t sp, int splits, int tid) {
  if (tid < group) {
    const int64_t w = (t * p.num_heads + g * group + tid) * splits + sp;
    s.m[w] = -INFINITY;
    s.l[w] = 0.f;
  }
}

// One head's result from its warp (lane holds dims lane * VEC ..): the normalized output with
// one split, else the unnormalized partial (acc, m, l).
template <typename Act, int VEC>
__device__ __forceinline__ void StoreDecodeHead(const AttentionParams& p, const DecodeSplit& s, int64_t t, int64_t h,
                                                int64_t sp, int splits, int lane, const float (&acc)[VEC], float m,
                                                float l) {
  const int64_t hd = p.cache.head_dim;
  if (splits == 1) {
    Act* out = static_cast<Act*>(p.out) + t * (p.out_stride ? p.out_stride : p.num_heads * hd) + h * hd;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const int d = lane * VEC + e;
      if (d < hd) StoreF(out + d, l > 0.f ? acc[e] / l : 0.f);
    }
    return;
  }
  const int64_t w = (t * p.num_heads + h) * splits + sp;
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const int d = lane * VEC + e;
    if (d < hd) s.acc[w * hd + d] = acc[e];
  }
  if (lane == 0) {
    s.m[w] = m;
    s.l[w] = l;
  }
}

// Raises kernel k's dynamic shared-memory limit to `bytes` once per device (the call costs
// microseconds of host time; `done` is a bit per device, one variable per kernel).
template <typename Kernel>
cudaError_t EnsureDynamicSmem(Kernel* k, size_t bytes, std::atomic<uint64_t>& done) {
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t{1} << dev : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit)) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e == cudaSuccess && bit != 0) done.fetch_or(bit, std::memory_order_acq_rel);
  return e;
}

}  // namespace moeshard::gpu
