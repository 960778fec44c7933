// Internal to the attention kernels (attention*.cu): reading the paged KV cache four
// elements at a time, converted to fp32 exactly as the first kernel did one at a time.
#pragma once

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
