// Paged KV cache writes, causal paged attention's dispatch, and its reference kernel.
//
// LaunchAttention runs the kernel gpu_ops.cc chose (AttentionParams::algo): the tiled
// flash-attention kernel on CUDA cores (attention_tiled.cu) or bf16 tensor cores
// (attention_tc.cu), the split-K decode kernel
// (attention_decode.cu), or the reference kernel below, kept as the fallback.
//
// Reference kernel: one block of 4 warps per (token, query head). Each lane keeps head_dim / 32
// elements of q, of its running output and the running max / sum of an online softmax;
// warp w walks keys w, w + 4, ... of the visible range, so no score matrix is ever stored.
// The four partial softmax states are merged in shared memory at the end. Keys and values
// are read from the paged cache in its element type (fp32, bf16, or FP8 e4m3 with a scale
// per (slot, head)). A first version: K/V reads of GQA heads sharing a KV head are not
// shared, and a long sequence is not split across blocks.
#include <cuda_fp8.h>

#include <algorithm>

#include "kernels/cuda/act.cuh"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/launchers.h"

namespace moeshard::gpu {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxPerLane = 8;  // head_dim <= 256

template <KvElem E>
__device__ __forceinline__ float LoadKv(const void* base, const float* scales, int64_t idx, int64_t scale_idx) {
  if constexpr (E == KvElem::kF32) {
    return static_cast<const float*>(base)[idx];
  } else if constexpr (E == KvElem::kBF16) {
    return DevBf16ToF32(static_cast<const uint16_t*>(base)[idx]);
  } else {
    return DevE4M3ToF32(static_cast<const uint8_t*>(base)[idx]) * scales[scale_idx];
  }
}

template <typename Act, KvElem E>
__global__ void KvWriteKernel(KvWriteParams p) {
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x, h = blockIdx.y, hd = p.cache.head_dim, nkv = p.cache.num_kv_heads;
  const int64_t slot = p.slots[t];
  const int64_t dst = (slot * nkv + h) * hd;
  for (int which = 0; which < 2; ++which) {
    const Act* src = static_cast<const Act*>(which ? p.v : p.k) +
                     t * ((which ? p.v_stride : p.k_stride) ? (which ? p.v_stride : p.k_stride) : nkv * hd) + h * hd;
    void* base = which ? p.cache.v : p.cache.k;
    if constexpr (E == KvElem::kFp8E4M3) {
      float amax = 0.f;
      for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) amax = fmaxf(amax, fabsf(LoadF(src + d)));
      amax = WarpMax(amax);
      if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = amax;
      __syncthreads();
      amax = 0.f;
      for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) amax = fmaxf(amax, scratch[w]);
      __syncthreads();
      const float scale = amax > 0.f ? amax / 448.f : 1.f;
      for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
        static_cast<uint8_t*>(base)[dst + d] = static_cast<uint8_t>(
            __nv_cvt_float_to_fp8(LoadF(src + d) / scale, __NV_SATFINITE, __NV_E4M3));
      }
      if (threadIdx.x == 0) (which ? p.cache.v_scale : p.cache.k_scale)[slot * nkv + h] = scale;
    } else if constexpr (E == KvElem::kBF16) {
      for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
        static_cast<uint16_t*>(base)[dst + d] = DevF32ToBf16(LoadF(src + d));
      }
    } else {
      for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) static_cast<float*>(base)[dst + d] = LoadF(src + d);
    }
  }
}

template <typename Act, KvElem E>
__global__ void __launch_bounds__(kWarps * 32) AttentionKernel(AttentionParams p) {
  __shared__ float s_m[kWarps], s_l[kWarps];
  __shared__ float s_acc[kWarps][kMaxPerLane * 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const int64_t hd = p.cache.head_dim, nkv = p.cache.num_kv_heads, bs = p.cache.block_size;
  const int64_t g = h / (p.num_heads / nkv);
  const int64_t pos = p.pos[t];
  const int64_t first = p.window > 0 ? max(int64_t{0}, pos - p.window + 1) : 0;
  const int32_t* table = p.block_tables + p.table_offset[t];
  const PagedSlots slots(table, bs);
  const Act* q = static_cast<const Act*>(p.q) + t * (p.q_stride ? p.q_stride : p.num_heads * hd) + h * hd;

  float qr[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int64_t d = lane + 32 * j;
    qr[j] = d < hd ? LoadF(q + d) * p.scale : 0.f;
    acc[j] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int64_t kp = first + warp; kp <= pos; kp += kWarps) {
    const int64_t slot = slots(kp);
    const int64_t base = (slot * nkv + g) * hd, sidx = slot * nkv + g;
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int64_t d = lane + 32 * j;
      if (d < hd) s = fmaf(qr[j], LoadKv<E>(p.cache.k, p.cache.k_scale, base + d, sidx), s);
    }
    s = WarpSum(s);
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new), w = expf(s - m_new);
    l = l * corr + w;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int64_t d = lane + 32 * j;
      if (d < hd) acc[j] = acc[j] * corr + w * LoadKv<E>(p.cache.v, p.cache.v_scale, base + d, sidx);
    }
    m = m_new;
  }
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) s_acc[warp][lane + 32 * j] = acc[j];
  __syncthreads();
  if (warp != 0) return;
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, s_m[w]);
  float L = 0.f, f[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    f[w] = s_l[w] > 0.f ? expf(s_m[w] - M) : 0.f;
    L += s_l[w] * f[w];
  }
  Act* out = static_cast<Act*>(p.out) + t * (p.out_stride ? p.out_stride : p.num_heads * hd) + h * hd;
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int64_t d = lane + 32 * j;
    if (d >= hd) continue;
    float o = 0.f;
    for (int w = 0; w < kWarps; ++w) o += s_acc[w][d] * f[w];
    StoreF(out + d, o / L);
  }
}

template <typename Act>
cudaError_t LaunchKvWriteAct(const KvWriteParams& p, cudaStream_t st) {
  dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(p.cache.num_kv_heads));
  switch (p.cache.elem) {
    case KvElem::kF32: KvWriteKernel<Act, KvElem::kF32><<<grid, 128, 0, st>>>(p); break;
    case KvElem::kBF16: KvWriteKernel<Act, KvElem::kBF16><<<grid, 128, 0, st>>>(p); break;
    case KvElem::kFp8E4M3: KvWriteKernel<Act, KvElem::kFp8E4M3><<<grid, 128, 0, st>>>(p); break;
  }
  return cudaGetLastError();
}

template <typename Act>
cudaError_t LaunchAttentionAct(const AttentionParams& p, cudaStream_t st) {
  dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(p.num_heads));
  switch (p.cache.elem) {
    case KvElem::kF32: AttentionKernel<Act, KvElem::kF32><<<grid, kWarps * 32, 0, st>>>(p); break;
    case KvElem::kBF16: AttentionKernel<Act, KvElem::kBF16><<<grid, kWarps * 32, 0, st>>>(p); break;
    case KvElem::kFp8E4M3: AttentionKernel<Act, KvElem::kFp8E4M3><<<grid, kWarps * 32, 0, st>>>(p); break;
  }
  return cudaGetLastError();
}

}  // namespace

int64_t MaxAttentionHeadDim() { return kMaxPerLane * 32; }

cudaError_t LaunchKvWrite(const KvWriteParams& p, cudaStream_t st) {
  return p.dtype == ActDType::kF32 ? LaunchKvWriteAct<float>(p, st) : LaunchKvWriteAct<uint16_t>(p, st);
}

int64_t AttentionDecodeSplits(const AttentionParams& p) {
  if (p.workspace == nullptr || p.num_tokens <= 0) return 1;
  const int64_t per_split = p.num_tokens * p.num_heads * (p.cache.head_dim + 2) * static_cast<int64_t>(sizeof(float));
  int64_t splits = std::min<int64_t>(p.workspace_bytes / per_split, MaxAttentionSplits());
  int sms = DeviceSmCount();
  if (sms <= 0) sms = 132;
  // Waves of CTAs: `slots` run at once (the tensor-core kernels' occupancy, ~4 an SM for the
  // others). The count of splits s minimizes ceil(s · ctas / slots) / s, each CTA's share of
  // the keys times the waves, trying s up to one full wave's worth (at least 4): 1 × 128K
  // over 4 KV heads on 132 SMs takes 66 splits (two CTAs an SM, below); 64 × 4K at 3 CTAs an SM
  // takes 3 (768 CTAs, two full waves). Ties go to fewer splits.
  // The kernels leave a split of fewer than 64 keys empty. On an H200, 4 sequences x 4096 keys
  // x 4 KV heads (FMA kernel): 8 splits 117 us, 16: 68, 32: 45, 64: 55.
  const int64_t ctas = std::max<int64_t>(1, p.num_tokens * p.cache.num_kv_heads);
  const bool tc = p.dtype == ActDType::kBF16 && DecodeTcSupports(p);
  int64_t per_sm = tc ? DecodeTcCtasPerSm(p) : 4;
  // Few (token, KV head) pairs: fewer, longer splits counted at two CTAs an SM beat more, shorter
  // ones at the three that the FP8 kernels keep resident (each split's fixed cost, and the
  // combine's rows). attention_bench --back-to-back 20, FP8, H200 2026-12-03, µs at two against
  // three: 1 x 4K 17.1 / 18.5, 4 x 4K 17.9 / 21.5, 1 x 128K 59.8 / 61.1; from 16 sequences on
  // three win: 16 x 32K 170 / 186, 64 x 4K 107 / 121 (at three / at two).
  if (tc && per_sm > 2 && ctas * 4 <= sms) per_sm = 2;
  const int64_t slots = static_cast<int64_t>(sms) * per_sm;
  const int64_t limit = std::min<int64_t>(splits, std::max<int64_t>(4, slots / ctas));
  int64_t best = 1;
  for (int64_t s = 2; s <= limit; ++s) {
    // waves(s) / s < waves(best) / best, in integers
    if (((s * ctas + slots - 1) / slots) * best < ((best * ctas + slots - 1) / slots) * s) best = s;
  }
  return best;
}

cudaError_t LaunchAttention(const AttentionParams& p, cudaStream_t st) {
  switch (p.algo) {
    case AttentionAlgo::kTiled: return LaunchAttentionTiled(p, st);
    case AttentionAlgo::kTiledTensorCore: return LaunchAttentionTensorCore(p, st);
    case AttentionAlgo::kWgmma: return LaunchAttentionWgmma(p, st);
    case AttentionAlgo::kSplitDecode: return LaunchAttentionSplitDecode(p, AttentionDecodeSplits(p), st);
    default: break;
  }
  return p.dtype == ActDType::kF32 ? LaunchAttentionAct<float>(p, st) : LaunchAttentionAct<uint16_t>(p, st);
}

}  // namespace moeshard::gpu
