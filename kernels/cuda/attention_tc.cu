// Flash-attention-2 style paged attention on the tensor cores, for bf16 activations.
//
// The tiling of attention_tiled.cu (one CTA per (tile of consecutive tokens, KV head), 64
// query rows = tile_tokens x group GQA heads, one pass per run of equal table_offset), but
// 4 warps of 16 rows each and mma.sync m16n8k16 (bf16 operands, fp32 accumulation) for
// both S = Q Kᵀ and O += P V. K and V tiles (64 keys) are read from the paged cache once,
// converted to bf16 (exact for bf16 and for fp32 caches written from bf16 activations;
// FP8 times its scale is rounded to bf16) into shared memory; Q stays unscaled bf16 and
// the fp32 scores are scaled. The online softmax runs in fp32 on the accumulator
// fragments (a row's 16 values per tile spread over the 4 lanes of a quad); P is rounded
// to bf16 in registers and fed straight back as the A operand of P V; V's B fragments come
// from ldmatrix.trans. head_dim <= 128.
#include <climits>
#include <cstdlib>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/cp_async.cuh"

namespace moeshard::gpu {
namespace {

constexpr int kThreads = 128, kRows = 64, kBK = 64;
constexpr bool kTcPipelineByDefault = true;

// PIPE: K and V tiles are copied by cp.async, the next tile's copy in flight while the current
// one is computed: a bf16 cache into two bf16 buffers each; an FP8 cache's bytes and scales into
// two staging buffers, converted (value times scale, rounded to bf16, as LoadKv4 + PackBf16
// without the pipeline) into one bf16 buffer each before the tile is computed.
template <int HD, bool PIPE, bool FP8 = false>
constexpr size_t TcSmemBytes() {
  constexpr int nbuf = PIPE ? 2 : 1;
  constexpr int nbf = PIPE && !FP8 ? 2 : 1;  // bf16 K/V buffers
  constexpr size_t staging = PIPE && FP8 ? 2 * 2 * (size_t{kBK} * HD + kBK * sizeof(float)) : 0;
  return (kRows + 2 * nbf * kBK) * (HD + 8) * sizeof(uint16_t) + staging + nbuf * kBK * sizeof(int64_t) +
         2 * kRows * sizeof(int);
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  return static_cast<uint32_t>(DevF32ToBf16(lo)) | (static_cast<uint32_t>(DevF32ToBf16(hi)) << 16);
}

__device__ __forceinline__ void Mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void LdMatrixX4(const uint16_t* p, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void LdMatrixX4Trans(const uint16_t* p, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                uint32_t& r3) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

template <KvElem E, int HD, bool PIPE>
__global__ void __launch_bounds__(kThreads) TcAttentionKernel(AttentionParams p, int group, int tile_tokens) {
  constexpr bool FP8 = E == KvElem::kFp8E4M3;
  static_assert(!PIPE || E == KvElem::kBF16 || FP8, "cp.async copies bf16 and FP8 caches only");
  constexpr int LD = HD + 8, D4 = HD / 4, D8 = HD / 8, KS = HD / 16, NT = HD / 8, SN = kBK / 8;
  constexpr int kBuf = PIPE ? 2 : 1;          // slot-index buffers (and the copies in flight)
  constexpr int kBf = PIPE && !FP8 ? 2 : 1;   // bf16 K/V buffers
  extern __shared__ float4 smem4[];
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem4);
  uint16_t* Ks = Qs + kRows * LD;     // [kBf][kBK][LD]
  uint16_t* Vs = Ks + kBf * kBK * LD;  // [kBf][kBK][LD]
  // FP8 staging: [kBuf][kBK][HD] bytes of K, then of V, then [kBuf][kBK] scales of K, of V.
  uint8_t* k8 = reinterpret_cast<uint8_t*>(Vs + kBf * kBK * LD);
  uint8_t* v8 = k8 + (PIPE && FP8 ? kBuf * kBK * HD : 0);
  float* k8s = reinterpret_cast<float*>(v8 + (PIPE && FP8 ? kBuf * kBK * HD : 0));
  float* v8s = k8s + (PIPE && FP8 ? kBuf * kBK : 0);
  int64_t* kidx = reinterpret_cast<int64_t*>(v8s + (PIPE && FP8 ? kBuf * kBK : 0));  // [kBuf][kBK]
  int* rpos = reinterpret_cast<int*>(kidx + kBuf * kBK);
  int* rfirst = rpos + kRows;
  __shared__ int s_range[2];

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, gq = lane / 4, tq = lane % 4;
  const int64_t hd = p.cache.head_dim, nkv = p.cache.num_kv_heads, bs = p.cache.block_size;
  const int64_t g = blockIdx.y;
  const int64_t tile = static_cast<int64_t>(gridDim.x) - 1 - blockIdx.x;
  const int64_t t_begin = tile * tile_tokens, t_end = min(p.num_tokens, t_begin + tile_tokens);
  const int64_t q_stride = p.q_stride ? p.q_stride : p.num_heads * hd;
  const int64_t o_stride = p.out_stride ? p.out_stride : p.num_heads * hd;
  const int rows_used = tile_tokens * group;
  const uint16_t* qbase = static_cast<const uint16_t*>(p.q);
  uint16_t* obase = static_cast<uint16_t*>(p.out);
  const int row0 = warp * 16 + gq;  // this thread's rows: row0 and row0 + 8

  for (int64_t s0 = t_begin; s0 < t_end;) {
    const int64_t s1 = SameTableEnd(p, s0, t_end);
    const PagedSlots slots(p.block_tables + p.table_offset[s0], bs);
    __syncthreads();
    StoreRowPositions(p, s0, s1, group, rows_used, kRows, tid, rpos, rfirst);
    for (int i = tid; i < kRows * D4; i += kThreads) {
      const int r = i / D4, d = (i % D4) * 4;
      const int64_t t = s0 + r / group;
      uint16_t v[4] = {0, 0, 0, 0};
      if (r < rows_used && t < s1) {
        const uint16_t* q = qbase + t * q_stride + (g * group + r % group) * hd;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (d + e < hd) v[e] = q[d + e];
        }
      }
      *reinterpret_cast<uint2*>(&Qs[r * LD + d]) =
          make_uint2(v[0] | (static_cast<uint32_t>(v[1]) << 16), v[2] | (static_cast<uint32_t>(v[3]) << 16));
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

    const int my_pos[2] = {rpos[row0], rpos[row0 + 8]};
    const int my_first[2] = {rfirst[row0], rfirst[row0 + 8]};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
    }
    // Skip the tiles no row of this warp sees (a warp whose rows are all invalid does none).
    const int warp_hi = max(max(rpos[warp * 16 + tq], rpos[warp * 16 + tq + 4]),
                            max(rpos[warp * 16 + tq + 8], rpos[warp * 16 + tq + 12]));
    int wh = warp_hi;
    wh = max(wh, __shfl_xor_sync(0xffffffffu, wh, 1));
    wh = max(wh, __shfl_xor_sync(0xffffffffu, wh, 2));

    // PIPE: slot indices of the tile at kn into kidx[b] (threads < kBK), and its copy.
    auto slots_of = [&](int kn, int b) {
      if (tid < kBK) {
        const int kp = kn + tid;
        kidx[b * kBK + tid] = kp <= k_hi ? slots(kp) * nkv + g : -1;
      }
    };
    auto copy_tile = [&](int b) {
      if constexpr (FP8) {
        const uint8_t* kc = static_cast<const uint8_t*>(p.cache.k);
        const uint8_t* vc = static_cast<const uint8_t*>(p.cache.v);
#pragma unroll 4
        for (int i = tid; i < kBK * (HD / 16); i += kThreads) {
          const int key = i / (HD / 16), d = (i % (HD / 16)) * 16;
          const int64_t sidx = kidx[b * kBK + key];
          const bool valid = sidx >= 0 && d < hd;
          const int64_t off = valid ? sidx * hd + d : 0;
          CpAsync16(&k8[(b * kBK + key) * HD + d], kc + off, valid);
          CpAsync16(&v8[(b * kBK + key) * HD + d], vc + off, valid);
        }
        if (tid < kBK) {
          const int64_t sidx = kidx[b * kBK + tid];
          CpAsync4(&k8s[b * kBK + tid], p.cache.k_scale + (sidx >= 0 ? sidx : 0), sidx >= 0);
          CpAsync4(&v8s[b * kBK + tid], p.cache.v_scale + (sidx >= 0 ? sidx : 0), sidx >= 0);
        }
      } else {
        const uint16_t* kc = static_cast<const uint16_t*>(p.cache.k);
        const uint16_t* vc = static_cast<const uint16_t*>(p.cache.v);
#pragma unroll 4
        for (int i = tid; i < kBK * D8; i += kThreads) {
          const int key = i / D8, d = (i % D8) * 8;
          const int64_t sidx = kidx[b * kBK + key];
          const bool valid = sidx >= 0 && d < hd;
          const int64_t off = valid ? sidx * hd + d : 0;
          CpAsync16(&Ks[(b * kBK + key) * LD + d], kc + off, valid);
          CpAsync16(&Vs[(b * kBK + key) * LD + d], vc + off, valid);
        }
      }
      CpCommit();
    };
    if constexpr (PIPE) {
      slots_of(k_lo, 0);
      __syncthreads();
      copy_tile(0);
    }
    int it = 0;
    for (int k0 = k_lo; k0 <= k_hi; k0 += kBK, ++it) {
      const int buf = PIPE ? (it & 1) : 0;
      const uint16_t* Kb = Ks + (FP8 ? 0 : buf) * kBK * LD;
      const uint16_t* Vb = Vs + (FP8 ? 0 : buf) * kBK * LD;
      if constexpr (PIPE) {
        const bool more = k0 + kBK <= k_hi;
        if (more) slots_of(k0 + kBK, buf ^ 1);  // that buffer's last tile finished at the last barrier
        __syncthreads();
        if (more) {
          copy_tile(buf ^ 1);
          CpWait<1>();  // this thread's copies of tile `it` have landed
        } else {
          CpWait<0>();
        }
        __syncthreads();  // everyone's copies of tile `it` are visible
        if constexpr (FP8) {  // staging -> the bf16 buffer (the last tile's reads ended at its barrier)
          for (int i = tid; i < 2 * kBK * (HD / 4); i += kThreads) {
            const int isv = i / (kBK * (HD / 4)), j = i % (kBK * (HD / 4));
            const int key = j / (HD / 4), d = (j % (HD / 4)) * 4;
            const uint32_t u = *reinterpret_cast<const uint32_t*>(&(isv ? v8 : k8)[(buf * kBK + key) * HD + d]);
            const float sc = (isv ? v8s : k8s)[buf * kBK + key];
            const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u & 0xffffu), __NV_E4M3);
            const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u >> 16), __NV_E4M3);
            const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
            const float2 c = __half22float2(*reinterpret_cast<const __half2*>(&hi));
            *reinterpret_cast<uint2*>(&(isv ? Vs : Ks)[key * LD + d]) =
                make_uint2(PackBf16(a.x * sc, a.y * sc), PackBf16(c.x * sc, c.y * sc));
          }
          __syncthreads();
        }
      } else {
        if (tid < kBK) {
          const int kp = k0 + tid;
          kidx[tid] = kp <= k_hi ? slots(kp) * nkv + g : -1;
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
          *reinterpret_cast<uint2*>(&Ks[key * LD + d]) = make_uint2(PackBf16(kv.x, kv.y), PackBf16(kv.z, kv.w));
          *reinterpret_cast<uint2*>(&Vs[key * LD + d]) = make_uint2(PackBf16(vv.x, vv.y), PackBf16(vv.z, vv.w));
        }
        __syncthreads();
      }
      if (k0 <= wh) {
        float s[SN][4];
#pragma unroll
        for (int n = 0; n < SN; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
        }
        // K's B fragments by ldmatrix: keys [16 np, 16 np + 16) x dims [16 ks, 16 ks + 16) give
        // (b0, b1) of key tiles 2 np and 2 np + 1.
        // This warp's Q rows as A fragments by ldmatrix (one per k step; kept in shared memory,
        // not registers: 32 more registers a thread would cost a CTA per SM).
        const uint16_t* krow = &Kb[(lane % 8 + (lane / 16) * 8) * LD + ((lane / 8) % 2) * 8];
        const uint16_t* qrow = &Qs[(warp * 16 + lane % 16) * LD + (lane / 16) * 8];
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
          uint32_t a0, a1, a2, a3;
          LdMatrixX4(qrow + ks * 16, a0, a1, a2, a3);
#pragma unroll
          for (int np = 0; np < SN / 2; ++np) {
            uint32_t b0, b1, b2, b3;
            LdMatrixX4(krow + np * 16 * LD + ks * 16, b0, b1, b2, b3);
            Mma16816(s[2 * np], a0, a1, a2, a3, b0, b1);
            Mma16816(s[2 * np + 1], a0, a1, a2, a3, b2, b3);
          }
        }
        uint32_t pa[SN][2];  // P as bf16 pairs: [n][0] row gq, [n][1] row gq + 8
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float mx = -INFINITY;
#pragma unroll
          for (int n = 0; n < SN; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int kp = k0 + n * 8 + 2 * tq + e;
              float& v = s[n][2 * h + e];
              v = (kp > my_pos[h] || kp < my_first[h]) ? -INFINITY : v * p.scale;
              mx = fmaxf(mx, v);
            }
          }
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_new = fmaxf(m[h], mx);
          const float m_use = m_new == -INFINITY ? 0.f : m_new;
          const float corr = expf(m[h] - m_use);
          float psum = 0.f;
#pragma unroll
          for (int n = 0; n < SN; ++n) {
            const float p0 = expf(s[n][2 * h] - m_use), p1 = expf(s[n][2 * h + 1] - m_use);
            psum += p0 + p1;
            pa[n][h] = PackBf16(p0, p1);
          }
          l[h] = l[h] * corr + psum;
          m[h] = m_new;
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            o[n][2 * h] *= corr;
            o[n][2 * h + 1] *= corr;
          }
        }
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          const uint32_t a0 = pa[2 * kk][0], a1 = pa[2 * kk][1], a2 = pa[2 * kk + 1][0], a3 = pa[2 * kk + 1][1];
          const int mi = lane / 8;
          const uint16_t* vrow = &Vb[(kk * 16 + (mi & 1) * 8 + lane % 8) * LD + (mi >> 1) * 8];
#pragma unroll
          for (int np = 0; np < NT / 2; ++np) {
            uint32_t b0, b1, b2, b3;
            LdMatrixX4Trans(vrow + np * 16, b0, b1, b2, b3);
            Mma16816(o[2 * np], a0, a1, a2, a3, b0, b1);
            Mma16816(o[2 * np + 1], a0, a1, a2, a3, b2, b3);
          }
        }
      }
      __syncthreads();
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float L = l[h];
      L += __shfl_xor_sync(0xffffffffu, L, 1);
      L += __shfl_xor_sync(0xffffffffu, L, 2);
      if (my_pos[h] < 0) continue;
      const int r = row0 + 8 * h;
      const int64_t t = s0 + r / group;
      uint16_t* out = obase + t * o_stride + (g * group + r % group) * hd;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int d = n * 8 + 2 * tq + e;
          if (d < hd) out[d] = DevF32ToBf16(L > 0.f ? o[n][2 * h + e] / L : 0.f);
        }
      }
    }
    s0 = s1;
  }
}

// The cp.async pipeline for bf16 caches with head_dim % 8 == 0 and FP8 caches with head_dim % 16
// == 0; MOESHARD_ATTN_TC_PIPELINE=0
// turns it off (a comparison knob for benchmarks).
inline bool TcPipelineAllowed() {
  const char* v = std::getenv("MOESHARD_ATTN_TC_PIPELINE");
  return v == nullptr || v[0] != '0';
}

template <KvElem E, int HD, bool PIPE>
cudaError_t LaunchTcHdPipe(const AttentionParams& p, cudaStream_t st) {
  const int group = static_cast<int>(p.num_heads / p.cache.num_kv_heads);
  const int tile_tokens = kRows / group;
  const int64_t tiles = (p.num_tokens + tile_tokens - 1) / tile_tokens;
  constexpr size_t smem = TcSmemBytes<HD, PIPE, E == KvElem::kFp8E4M3>();
  auto* k = &TcAttentionKernel<E, HD, PIPE>;
  static std::atomic<uint64_t> smem_set{0};
  if (cudaError_t e = EnsureDynamicSmem(k, smem, smem_set); e != cudaSuccess) return e;
  dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.cache.num_kv_heads));
  k<<<grid, kThreads, smem, st>>>(p, group, tile_tokens);
  return cudaGetLastError();
}

template <KvElem E, int HD>
cudaError_t LaunchTcHd(const AttentionParams& p, cudaStream_t st) {
  if constexpr (E == KvElem::kBF16 && kTcPipelineByDefault) {
    if (p.cache.head_dim % 8 == 0 && TcPipelineAllowed()) return LaunchTcHdPipe<E, HD, true>(p, st);
  }
  if constexpr (E == KvElem::kFp8E4M3 && kTcPipelineByDefault) {
    if (p.cache.head_dim % 16 == 0 && p.cache.k_scale != nullptr && p.cache.v_scale != nullptr &&
        TcPipelineAllowed()) {
      return LaunchTcHdPipe<E, HD, true>(p, st);
    }
  }
  return LaunchTcHdPipe<E, HD, false>(p, st);
}

template <KvElem E>
cudaError_t LaunchTcElem(const AttentionParams& p, cudaStream_t st) {
  return p.cache.head_dim <= 64 ? LaunchTcHd<E, 64>(p, st) : LaunchTcHd<E, 128>(p, st);
}

}  // namespace

cudaError_t LaunchAttentionTensorCore(const AttentionParams& p, cudaStream_t st) {
  switch (p.cache.elem) {
    case KvElem::kF32: return LaunchTcElem<KvElem::kF32>(p, st);
    case KvElem::kBF16: return LaunchTcElem<KvElem::kBF16>(p, st);
    case KvElem::kFp8E4M3: return LaunchTcElem<KvElem::kFp8E4M3>(p, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace moeshard::gpu
