// Split-K ("flash-decoding") paged attention for decode steps: few tokens per sequence,
// long contexts.
//
// One CTA of 4 warps per (key split, KV head, token). The token's visible keys are cut
// into `splits` ranges (each a multiple of 32 keys, at least 64); a CTA walks its range
// 32 keys at a time: K and V tiles are read once from the paged cache into shared memory
// (fp32) and serve every GQA query head of the KV head. Warp w owns heads w, w + 4, ...
// (group <= 16); lane i scores key i of the tile for each of its heads, the online softmax
// state (max, sum) of a head lives in its warp, and lane i accumulates output dims
// [i * HD / 32, (i + 1) * HD / 32). With one split the CTA writes the output; otherwise it
// writes its unnormalized partial (acc, max, sum) to the workspace and a combine kernel
// merges the splits of each (token, head). fp32 FMA throughout.
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/pdl.cuh"

namespace moeshard::gpu {
namespace {

constexpr int kThreads = 128, kBK = 32, kHpw = 4, kMaxGroup = 4 * kHpw;
constexpr int kMaxSplits = static_cast<int>(kAttentionMaxSplits);  // gpu_params.h

template <int HD>
constexpr size_t DecodeSmemBytes() {
  return (kMaxGroup * HD + 2 * kBK * (HD + 4)) * sizeof(float) + kBK * sizeof(int64_t);
}

template <int VEC>
__device__ __forceinline__ void LoadVec(const float* src, float (&v)[VEC]) {
  if constexpr (VEC == 2) {
    const float2 a = *reinterpret_cast<const float2*>(src);
    v[0] = a.x;
    v[1] = a.y;
  } else {
#pragma unroll
    for (int c = 0; c < VEC / 4; ++c) {
      const float4 a = *reinterpret_cast<const float4*>(src + 4 * c);
      v[4 * c] = a.x;
      v[4 * c + 1] = a.y;
      v[4 * c + 2] = a.z;
      v[4 * c + 3] = a.w;
    }
  }
}

template <typename Act, KvElem E, int HD>
__global__ void __launch_bounds__(kThreads) SplitDecodeKernel(AttentionParams p, int group, int splits, float* ws) {
  constexpr int LD = HD + 4, D4 = HD / 4, VEC = HD / 32;
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);
  float* Ks = Qs + kMaxGroup * HD;
  float* Vs = Ks + kBK * LD;
  int64_t* kidx = reinterpret_cast<int64_t*>(Vs + kBK * LD);
  PdlWait();
  PdlTrigger();

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t t = blockIdx.z, g = blockIdx.y, sp = blockIdx.x;
  const int64_t hd = p.cache.head_dim, nkv = p.cache.num_kv_heads, bs = p.cache.block_size, H = p.num_heads;
  const DecodeSplit split = DecodeSplitOf(p, t, sp, splits, ws);
  const int64_t kb = split.kb, ke = split.ke;
  if (kb >= ke) return MarkEmptySplit(p, split, t, g, group, sp, splits, tid);
  const int32_t* table = p.block_tables + p.table_offset[t];
  const PagedSlots slots(table, bs);
  const Act* q = static_cast<const Act*>(p.q) + t * (p.q_stride ? p.q_stride : H * hd) + g * group * hd;
  for (int i = tid; i < group * D4; i += kThreads) {
    const int r = i / D4, d = (i % D4) * 4;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (d + e < hd) v[e] = LoadF(q + r * hd + d + e) * p.scale;
    }
    *reinterpret_cast<float4*>(&Qs[r * HD + d]) = make_float4(v[0], v[1], v[2], v[3]);
  }
  float m[kHpw], l[kHpw], acc[kHpw][VEC];
#pragma unroll
  for (int j = 0; j < kHpw; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.f;
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[j][e] = 0.f;
  }
  for (int64_t k0 = kb; k0 < ke; k0 += kBK) {
    __syncthreads();  // Q visible; the previous tile's reads done
    if (tid < kBK) {
      const int64_t kp = k0 + tid;
      kidx[tid] = kp < ke ? slots(kp) * nkv + g : -1;
    }
    __syncthreads();
#pragma unroll 4
    for (int i = tid; i < kBK * D4; i += kThreads) {
      const int key = i / D4, d = (i % D4) * 4;
      const int64_t sidx = kidx[key];
      float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
      if (sidx >= 0 && d < hd) {
        kv = LoadKv4<E>(p.cache.k, p.cache.k_scale, sidx * hd + d, sidx);
        vv = LoadKv4<E>(p.cache.v, p.cache.v_scale, sidx * hd + d, sidx);
      }
      *reinterpret_cast<float4*>(&Ks[key * LD + d]) = kv;
      *reinterpret_cast<float4*>(&Vs[key * LD + d]) = vv;
    }
    __syncthreads();
    float s[kHpw];
#pragma unroll
    for (int j = 0; j < kHpw; ++j) s[j] = 0.f;
#pragma unroll 4
    for (int d = 0; d < HD; d += 4) {
      const float4 kv = *reinterpret_cast<const float4*>(&Ks[lane * LD + d]);
#pragma unroll
      for (int j = 0; j < kHpw; ++j) {
        if (warp + 4 * j < group) {
          const float4 qv = *reinterpret_cast<const float4*>(&Qs[(warp + 4 * j) * HD + d]);
          s[j] = fmaf(qv.x, kv.x, s[j]);
          s[j] = fmaf(qv.y, kv.y, s[j]);
          s[j] = fmaf(qv.z, kv.z, s[j]);
          s[j] = fmaf(qv.w, kv.w, s[j]);
        }
      }
    }
    const bool ok = k0 + lane < ke;
    float pj[kHpw];
#pragma unroll
    for (int j = 0; j < kHpw; ++j) {
      pj[j] = 0.f;
      if (warp + 4 * j >= group) continue;  // uniform in the warp
      const float sj = ok ? s[j] : -INFINITY;
      const float m_new = fmaxf(m[j], WarpMax(sj));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float corr = expf(m[j] - m_use);
      pj[j] = expf(sj - m_use);
      l[j] = l[j] * corr + WarpSum(pj[j]);
      m[j] = m_new;
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[j][e] *= corr;
    }
#pragma unroll 4
    for (int k = 0; k < kBK; ++k) {
      float v[VEC];
      LoadVec<VEC>(&Vs[k * LD + lane * VEC], v);
#pragma unroll
      for (int j = 0; j < kHpw; ++j) {
        if (warp + 4 * j >= group) continue;
        const float pk = __shfl_sync(0xffffffffu, pj[j], k);
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[j][e] = fmaf(pk, v[e], acc[j][e]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kHpw; ++j) {
    const int hh = warp + 4 * j;
    if (hh < group) StoreDecodeHead<Act, VEC>(p, split, t, g * group + hh, sp, splits, lane, acc[j], m[j], l[j]);
  }
}

// Merges the splits of one (token, head): out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
// Latency-bound (a few hundred KB over tens of CTAs, just written and in L2), so every load is
// issued early: each thread reads one split's m and l, then 4 dims (a float4) of every G-th
// split's partial (G = 128 / (head_dim / 4) groups of threads, each a row of the partials, eight
// rows in flight a thread), and the groups' sums meet in shared memory. The ncu time of one
// token at 4K-32K context over 99 splits was 11-14 us with a thread a dim and 8 splits at a time
// in flight; head sizes that are not a multiple of 4 or above 512 take that loop still.
template <typename Act>
__global__ void __launch_bounds__(128) CombineKernel(AttentionParams p, int splits, const float* ws) {
  constexpr int kRowsInFlight = 8;
  static_assert(kMaxSplits <= kThreads, "a thread a split's m and l");
  __shared__ float w[kMaxSplits];
  __shared__ float red[2][kThreads / 32];
  __shared__ __align__(16) float part[kThreads * 4];
  PdlWait();
  PdlTrigger();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t t = blockIdx.x, h = blockIdx.y, H = p.num_heads, hd = p.cache.head_dim;
  const int64_t total = p.num_tokens * H * splits;
  const int64_t base = (t * H + h) * splits;
  const float* ws_acc = ws;
  const float* ws_m = ws + total * hd;
  const float* ws_l = ws_m + total;
  // The weights: M = max of the non-empty splits' m, w_s = e^(m_s - M) (0 for an empty split,
  // whose partial was never written), L = sum_s l_s w_s.
  float lv = 0.f, mv = -INFINITY;
  if (tid < splits) {
    lv = ws_l[base + tid];
    mv = lv > 0.f ? ws_m[base + tid] : -INFINITY;
  }
  float M = WarpMax(mv);
  if (lane == 0) red[0][warp] = M;
  __syncthreads();
  M = fmaxf(fmaxf(red[0][0], red[0][1]), fmaxf(red[0][2], red[0][3]));
  const float f = lv > 0.f ? expf(mv - M) : 0.f;
  if (tid < kMaxSplits) w[tid] = f;
  const float Lw = WarpSum(lv * f);
  if (lane == 0) red[1][warp] = Lw;
  __syncthreads();
  const float L = (red[1][0] + red[1][1]) + (red[1][2] + red[1][3]);
  Act* out = static_cast<Act*>(p.out) + t * (p.out_stride ? p.out_stride : H * hd) + h * hd;
  if (hd % 4 != 0 || hd > 4 * kThreads) {
    for (int64_t d = tid; d < hd; d += kThreads) {
      float o = 0.f;
      for (int s = 0; s < splits; ++s) {
        if (w[s] != 0.f) o = fmaf(ws_acc[(base + s) * hd + d], w[s], o);
      }
      StoreF(out + d, L > 0.f ? o / L : 0.f);
    }
    return;
  }
  const int R = static_cast<int>(hd / 4), G = kThreads / R;  // threads a row, rows at a time
  const int r = tid / R, c = tid % R;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (r < G) {
    for (int s0 = r; s0 < splits; s0 += kRowsInFlight * G) {
      float4 a[kRowsInFlight];
      float fs[kRowsInFlight];
#pragma unroll
      for (int j = 0; j < kRowsInFlight; ++j) {
        const int s = s0 + j * G;
        fs[j] = s < splits ? w[s] : 0.f;
        a[j] = fs[j] != 0.f ? *reinterpret_cast<const float4*>(ws_acc + (base + s) * hd + 4 * c)
                            : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int j = 0; j < kRowsInFlight; ++j) {
        acc.x = fmaf(a[j].x, fs[j], acc.x);
        acc.y = fmaf(a[j].y, fs[j], acc.y);
        acc.z = fmaf(a[j].z, fs[j], acc.z);
        acc.w = fmaf(a[j].w, fs[j], acc.w);
      }
    }
    *reinterpret_cast<float4*>(part + r * hd + 4 * c) = acc;
  }
  __syncthreads();
  for (int64_t d = tid; d < hd; d += kThreads) {
    float o = 0.f;
    for (int g = 0; g < G; ++g) o += part[g * hd + d];
    StoreF(out + d, L > 0.f ? o / L : 0.f);
  }
}

template <typename Act, KvElem E, int HD>
cudaError_t LaunchDecodeHd(const AttentionParams& p, int splits, cudaStream_t st) {
  const int group = static_cast<int>(p.num_heads / p.cache.num_kv_heads);
  constexpr size_t smem = DecodeSmemBytes<HD>();
  auto* k = &SplitDecodeKernel<Act, E, HD>;
  static std::atomic<uint64_t> smem_set{0};
  if (cudaError_t e = EnsureDynamicSmem(k, smem, smem_set); e != cudaSuccess) return e;
  float* ws = splits > 1 ? static_cast<float*>(p.workspace) : nullptr;
  static const bool async_on = [] {
    const char* v = std::getenv("MOESHARD_ATTN_ASYNC");
    return !(v && v[0] == '0');
  }();
  if (std::is_same_v<Act, uint16_t> && DecodeTcSupports(p)) {  // attention_decode_tc.cu
    if (cudaError_t e = LaunchAttentionDecodeTc(p, splits, st); e != cudaSuccess || splits == 1) return e;
  } else if (E == KvElem::kBF16 && async_on && DecodeAsyncSupports(p)) {  // attention_decode_async.cu
    if (cudaError_t e = LaunchAttentionDecodeAsync(p, splits, st); e != cudaSuccess || splits == 1) return e;
  } else {
    dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(p.cache.num_kv_heads),
              static_cast<unsigned>(p.num_tokens));
    if (cudaError_t e = LaunchPdl(k, grid, kThreads, smem, st, p, group, splits, ws); e != cudaSuccess || splits == 1)
      return e;
  }
  dim3 cgrid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(p.num_heads));
  return LaunchPdl(CombineKernel<Act>, cgrid, 128, 0, st, p, splits, static_cast<const float*>(ws));
}

template <typename Act, KvElem E>
cudaError_t LaunchDecodeElem(const AttentionParams& p, int splits, cudaStream_t st) {
  const int64_t hd = p.cache.head_dim;
  if (hd <= 64) return LaunchDecodeHd<Act, E, 64>(p, splits, st);
  if (hd <= 128) return LaunchDecodeHd<Act, E, 128>(p, splits, st);
  return LaunchDecodeHd<Act, E, 256>(p, splits, st);
}

template <typename Act>
cudaError_t LaunchDecodeAct(const AttentionParams& p, int splits, cudaStream_t st) {
  switch (p.cache.elem) {
    case KvElem::kF32: return LaunchDecodeElem<Act, KvElem::kF32>(p, splits, st);
    case KvElem::kBF16: return LaunchDecodeElem<Act, KvElem::kBF16>(p, splits, st);
    case KvElem::kFp8E4M3: return LaunchDecodeElem<Act, KvElem::kFp8E4M3>(p, splits, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

int64_t MaxAttentionSplits() { return kMaxSplits; }
int64_t MaxSplitDecodeGroup() { return kMaxGroup; }

cudaError_t LaunchAttentionSplitDecode(const AttentionParams& p, int64_t splits, cudaStream_t st) {
  // MOESHARD_ATTN_SPLIT_KEYS: the fewest keys per split (default 64; rounded up to 32s).
  static const int64_t min_keys = [] {
    const char* v = std::getenv("MOESHARD_ATTN_SPLIT_KEYS");
    const long n = v ? std::strtol(v, nullptr, 10) : 64;
    return std::max<int64_t>(64, (n + 31) / 32 * 32);
  }();
  AttentionParams q = p;
  q.split_min_keys = min_keys;
  const int s = static_cast<int>(splits);
  return q.dtype == ActDType::kF32 ? LaunchDecodeAct<float>(q, s, st) : LaunchDecodeAct<uint16_t>(q, s, st);
}

}  // namespace moeshard::gpu
