// Flash-attention-2 style paged attention for prefill and multi-token chunks.
//
// One CTA of 256 threads per (tile of consecutive tokens, KV head). Its 64 query rows are
// (token, GQA head) pairs of that KV head: tile_tokens = 64 / group tokens times `group`
// heads, row r = token (r / group), head g * group + r % group. Keys are walked 64 at a
// time: each K tile is read from the paged cache once, converted to fp32 into shared memory
// and used by all 64 rows; the V tile then replaces it (for head_dim <= 64 it is fetched
// into registers while the scores are computed). Thread (ty, tx) of a 16 x 16 grid owns rows
// 4ty..4ty+3: scores of keys tx + 16j (j < 4), and output dims 4tx + 64c (c < HD / 64).
// The online softmax runs in fp32 per row (max shared among the 16 threads of a row);
// no score matrix leaves shared memory. A tile whose tokens come from several sequences
// (different table_offset) is processed one run of equal table_offset at a time, so the
// batch needs no chunk boundaries. All arithmetic is fp32 FMA (no TF32).
#include <climits>

#include "kernels/cuda/attention_common.cuh"

namespace moeshard::gpu {
namespace {

constexpr int kThreads = 256, kRows = 64, kBK = 64, kPLd = kRows + 4;

template <int HD>
constexpr size_t TiledSmemBytes() {
  return (2 * kRows * (HD + 4) + kBK * kPLd) * sizeof(float) + kBK * sizeof(int64_t) + 2 * kRows * sizeof(int);
}

template <typename Act, KvElem E, int HD>
__global__ void __launch_bounds__(kThreads, HD <= 128 ? 2 : 1)
    TiledAttentionKernel(AttentionParams p, int group, int tile_tokens) {
  constexpr int LD = HD + 4, NC = HD / 64, D4 = HD / 4;
  constexpr bool kPrefetchV = HD <= 64;  // at 128 the prefetch registers spill
  constexpr int kVRegs = kPrefetchV ? kBK * D4 / kThreads : 1;
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);
  float* KV = Qs + kRows * LD;
  float* Ps = KV + kBK * LD;
  int64_t* kidx = reinterpret_cast<int64_t*>(Ps + kBK * kPLd);
  int* rpos = reinterpret_cast<int*>(kidx + kBK);
  int* rfirst = rpos + kRows;
  __shared__ int s_range[2];

  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t hd = p.cache.head_dim, nkv = p.cache.num_kv_heads, bs = p.cache.block_size;
  const int64_t g = blockIdx.y;
  const int64_t tile = static_cast<int64_t>(gridDim.x) - 1 - blockIdx.x;  // long (late) tiles first
  const int64_t t_begin = tile * tile_tokens, t_end = min(p.num_tokens, t_begin + tile_tokens);
  const int64_t q_stride = p.q_stride ? p.q_stride : p.num_heads * hd;
  const int64_t o_stride = p.out_stride ? p.out_stride : p.num_heads * hd;
  const int rows_used = tile_tokens * group;
  const Act* qbase = static_cast<const Act*>(p.q);
  Act* obase = static_cast<Act*>(p.out);

  for (int64_t s0 = t_begin; s0 < t_end;) {
    const int64_t s1 = SameTableEnd(p, s0, t_end);
    const PagedSlots slots(p.block_tables + p.table_offset[s0], bs);
    __syncthreads();  // the previous run's reads of shared memory are done
    StoreRowPositions(p, s0, s1, group, rows_used, kRows, tid, rpos, rfirst);
    for (int i = tid; i < kRows * D4; i += kThreads) {
      const int r = i / D4, d = (i % D4) * 4;
      const int64_t t = s0 + r / group;
      float v[4] = {0.f, 0.f, 0.f, 0.f};
      if (r < rows_used && t < s1) {
        const Act* q = qbase + t * q_stride + (g * group + r % group) * hd;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (d + e < hd) v[e] = LoadF(q + d + e) * p.scale;
        }
      }
      *reinterpret_cast<float4*>(&Qs[r * LD + d]) = make_float4(v[0], v[1], v[2], v[3]);
    }
    __syncthreads();
    if (tid < 32) {
      int lo = INT_MAX, hi = -1;
      for (int r = tid; r < kRows; r += 32) {
        lo = min(lo, rfirst[r]);
        hi = max(hi, rpos[r]);
      }
      lo = WarpMinInt(lo);
      hi = WarpMaxInt(hi);
      if (tid == 0) {
        s_range[0] = lo;
        s_range[1] = hi;
      }
    }
    __syncthreads();
    const int k_lo = s_range[0], k_hi = s_range[1];
    int my_pos[4], my_first[4];
    float m[4], l[4], acc[4][NC][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      my_pos[i] = rpos[ty * 4 + i];
      my_first[i] = rfirst[ty * 4 + i];
      m[i] = -INFINITY;
      l[i] = 0.f;
#pragma unroll
      for (int c = 0; c < NC; ++c) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][c][e] = 0.f;
      }
    }

    for (int k0 = k_lo; k0 <= k_hi; k0 += kBK) {
      if (tid < kBK) {
        const int kp = k0 + tid;
        kidx[tid] = kp <= k_hi ? slots(kp) * nkv + g : -1;
      }
      __syncthreads();
#pragma unroll 4
      for (int i = tid; i < kBK * D4; i += kThreads) {
        const int key = i / D4, d = (i % D4) * 4;
        const int64_t sidx = kidx[key];
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (sidx >= 0 && d < hd) v = LoadKv4<E>(p.cache.k, p.cache.k_scale, sidx * hd + d, sidx);
        *reinterpret_cast<float4*>(&KV[key * LD + d]) = v;
      }
      __syncthreads();
      float4 vr[kVRegs];
      if constexpr (kPrefetchV) {
#pragma unroll
        for (int j = 0; j < kVRegs; ++j) {
          const int i = tid + j * kThreads, key = i / D4, d = (i % D4) * 4;
          const int64_t sidx = kidx[key];
          vr[j] = make_float4(0.f, 0.f, 0.f, 0.f);
          if (sidx >= 0 && d < hd) vr[j] = LoadKv4<E>(p.cache.v, p.cache.v_scale, sidx * hd + d, sidx);
        }
      }
      float s[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) s[i][j] = 0.f;
      }
#pragma unroll 4
      for (int d = 0; d < HD; d += 4) {
        float4 qv[4], kv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) qv[i] = *reinterpret_cast<const float4*>(&Qs[(ty * 4 + i) * LD + d]);
#pragma unroll
        for (int j = 0; j < 4; ++j) kv[j] = *reinterpret_cast<const float4*>(&KV[(tx + 16 * j) * LD + d]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            s[i][j] = fmaf(qv[i].x, kv[j].x, s[i][j]);
            s[i][j] = fmaf(qv[i].y, kv[j].y, s[i][j]);
            s[i][j] = fmaf(qv[i].z, kv[j].z, s[i][j]);
            s[i][j] = fmaf(qv[i].w, kv[j].w, s[i][j]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int kp = k0 + tx + 16 * j;
          if (kp > my_pos[i] || kp < my_first[i]) s[i][j] = -INFINITY;
          mx = fmaxf(mx, s[i][j]);
        }
#pragma unroll
        for (int o = 1; o < 16; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float m_new = fmaxf(m[i], mx);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;
        const float corr = expf(m[i] - m_use);
        float psum = 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float pj = expf(s[i][j] - m_use);
          Ps[(tx + 16 * j) * kPLd + ty * 4 + i] = pj;
          psum += pj;
        }
        l[i] = l[i] * corr + psum;
        m[i] = m_new;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[i][c][e] *= corr;
        }
      }
      __syncthreads();  // K reads done, P written
      if constexpr (kPrefetchV) {
#pragma unroll
        for (int j = 0; j < kVRegs; ++j) {
          const int i = tid + j * kThreads, key = i / D4, d = (i % D4) * 4;
          *reinterpret_cast<float4*>(&KV[key * LD + d]) = vr[j];
        }
      } else {
#pragma unroll 4
        for (int i = tid; i < kBK * D4; i += kThreads) {
          const int key = i / D4, d = (i % D4) * 4;
          const int64_t sidx = kidx[key];
          float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
          if (sidx >= 0 && d < hd) v = LoadKv4<E>(p.cache.v, p.cache.v_scale, sidx * hd + d, sidx);
          *reinterpret_cast<float4*>(&KV[key * LD + d]) = v;
        }
      }
      __syncthreads();
#pragma unroll 4
      for (int k = 0; k < kBK; ++k) {
        const float4 pv = *reinterpret_cast<const float4*>(&Ps[k * kPLd + ty * 4]);
        const float pr[4] = {pv.x, pv.y, pv.z, pv.w};
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const float4 v = *reinterpret_cast<const float4*>(&KV[k * LD + tx * 4 + 64 * c]);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            acc[i][c][0] = fmaf(pr[i], v.x, acc[i][c][0]);
            acc[i][c][1] = fmaf(pr[i], v.y, acc[i][c][1]);
            acc[i][c][2] = fmaf(pr[i], v.z, acc[i][c][2]);
            acc[i][c][3] = fmaf(pr[i], v.w, acc[i][c][3]);
          }
        }
      }
      __syncthreads();  // V and P reads done before the next tile overwrites them
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float L = l[i];
#pragma unroll
      for (int o = 1; o < 16; o <<= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
      if (my_pos[i] < 0) continue;
      const int r = ty * 4 + i;
      const int64_t t = s0 + r / group;
      Act* out = obase + t * o_stride + (g * group + r % group) * hd;
#pragma unroll
      for (int c = 0; c < NC; ++c) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int d = tx * 4 + 64 * c + e;
          if (d < hd) StoreF(out + d, L > 0.f ? acc[i][c][e] / L : 0.f);
        }
      }
    }
    s0 = s1;
  }
}

template <typename Act, KvElem E, int HD>
cudaError_t LaunchTiledHd(const AttentionParams& p, cudaStream_t st) {
  const int group = static_cast<int>(p.num_heads / p.cache.num_kv_heads);
  const int tile_tokens = kRows / group;
  const int64_t tiles = (p.num_tokens + tile_tokens - 1) / tile_tokens;
  constexpr size_t smem = TiledSmemBytes<HD>();
  auto* k = &TiledAttentionKernel<Act, E, HD>;
  static std::atomic<uint64_t> smem_set{0};
  if (cudaError_t e = EnsureDynamicSmem(k, smem, smem_set); e != cudaSuccess) return e;
  dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.cache.num_kv_heads));
  k<<<grid, kThreads, smem, st>>>(p, group, tile_tokens);
  return cudaGetLastError();
}

template <typename Act, KvElem E>
cudaError_t LaunchTiledElem(const AttentionParams& p, cudaStream_t st) {
  const int64_t hd = p.cache.head_dim;
  if (hd <= 64) return LaunchTiledHd<Act, E, 64>(p, st);
  if (hd <= 128) return LaunchTiledHd<Act, E, 128>(p, st);
  return LaunchTiledHd<Act, E, 256>(p, st);
}

template <typename Act>
cudaError_t LaunchTiledAct(const AttentionParams& p, cudaStream_t st) {
  switch (p.cache.elem) {
    case KvElem::kF32: return LaunchTiledElem<Act, KvElem::kF32>(p, st);
    case KvElem::kBF16: return LaunchTiledElem<Act, KvElem::kBF16>(p, st);
    case KvElem::kFp8E4M3: return LaunchTiledElem<Act, KvElem::kFp8E4M3>(p, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t LaunchAttentionTiled(const AttentionParams& p, cudaStream_t st) {
  return p.dtype == ActDType::kF32 ? LaunchTiledAct<float>(p, st) : LaunchTiledAct<uint16_t>(p, st);
}

}  // namespace moeshard::gpu
