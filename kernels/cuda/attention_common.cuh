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
    const uint32_t u = *reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(base) + idx);
    const float s = scales[scale_idx];
    return make_float4(DevE4M3ToF32(static_cast<uint8_t>(u)) * s, DevE4M3ToF32(static_cast<uint8_t>(u >> 8)) * s,
                       DevE4M3ToF32(static_cast<uint8_t>(u >> 16)) * s, DevE4M3ToF32(static_cast<uint8_t>(u >> 24)) * s);
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
