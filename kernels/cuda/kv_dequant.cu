// KvDequant: chosen blocks of an FP8 (e4m3 + per-(slot, head) scale) KV cache copied to bf16, so a
// prefill step can run the bf16 tensor-core attention on them instead of converting every FP8
// tile in the attention kernel's inner loop (which costs that kernel as many instructions again
// as its mmas: 128K-token prefill 81 s with FP8 KV against 40 s with bf16).
//
// One CTA per (block, K or V); each thread converts 8 bytes at a time. The arithmetic is the
// tensor-core prefill kernel's for its FP8 tiles (attention_tc.cu): e4m3 pair -> fp16 pair (exact)
// -> fp32, times the scale, rounded to bf16, so attention over the copy is attention over the cache.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/launchers.h"
#include "kernels/cuda/weight_decode.cuh"

namespace moeshard::gpu {
namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ uint32_t ScaledPair(uint32_t two_e4m3, float scale) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_e4m3 & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return static_cast<uint32_t>(DevF32ToBf16(f.x * scale)) | (static_cast<uint32_t>(DevF32ToBf16(f.y * scale)) << 16);
}

__global__ void __launch_bounds__(kThreads) KvDequantKernel(KvDequantParams p) {
  const int64_t bs = p.src.block_size, nkv = p.src.num_kv_heads, hd = p.src.head_dim;
  const int64_t per_block = bs * nkv * hd;  // bytes of one FP8 block, elements of one bf16 block
  const bool is_v = blockIdx.y == 1;
  const int64_t src = p.src_blocks[blockIdx.x];
  const uint8_t* in = static_cast<const uint8_t*>(is_v ? p.src.v : p.src.k) + src * per_block;
  const float* scale = (is_v ? p.src.v_scale : p.src.k_scale) + src * bs * nkv;  // [slot][head]
  uint16_t* out = static_cast<uint16_t*>(is_v ? p.v_out : p.k_out) + static_cast<int64_t>(blockIdx.x) * per_block;
  for (int64_t e = threadIdx.x * 8; e < per_block; e += kThreads * 8) {
    const uint2 raw = *reinterpret_cast<const uint2*>(in + e);
    const float sc = scale[e / hd];  // (slot * nkv + head): 8 values of one head (hd % 8 == 0)
    *reinterpret_cast<uint4*>(out + e) =
        make_uint4(ScaledPair(raw.x, sc), ScaledPair(raw.x >> 16, sc), ScaledPair(raw.y, sc), ScaledPair(raw.y >> 16, sc));
  }
}

}  // namespace

cudaError_t LaunchKvDequant(const KvDequantParams& p, cudaStream_t stream) {
  KvDequantKernel<<<dim3(static_cast<unsigned>(p.num_blocks), 2), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace moeshard::gpu
