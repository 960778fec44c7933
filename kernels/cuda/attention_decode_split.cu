// Split-K decode attention for long contexts on the tensor cores: the unfused split path of
// attention_decode_tc.cu (same splits, workspace and combine) with a cheaper inner loop, for a
// bf16 or FP8 cache with head_dim 64 or 128 and blocks of a multiple of 16 tokens, on sm_90.
//
// Why: at 1 x 128K the tensor-core split kernel read an FP8 cache, half the bytes, in the time
// of a bf16 one (ncu: 85 us, 35 % of DRAM bandwidth; 4.8 cycles between a warp's instructions,
// two warps a scheduler): what bounds it is the count of row-sized requests in flight, not
// bytes — each thread's cp.async pieces a row, and a version with one bulk copy a row (16 of
// them a warp's stage) read at the same rate, so the copy engine's requests were the limit.
// Here:
//   - each of the four warps streams its own 16 of every 64 keys through its own ring of
//     mbarrier stages, with no barrier across warps until the merge: one tensor-map box a stage
//     for K and one for V (16 consecutive slots of one KV head: a 16-token-aligned group of keys
//     within a block; keys outside the split's [kb, ke) are masked, and their V rows zeroed), the
//     128-byte rows in the 128-byte swizzle, so the fragment loads below are free of bank
//     conflicts; FP8 scales by cp.async, counted on the same barrier;
//   - FP8 K goes from shared memory straight into the B fragments: the QKᵀ contraction order
//     is free, so lane (n, c) takes the 4 bytes c * head_dim / 4 + 4 ks .. of key n's row for
//     k-step ks (16-byte loads, one conversion instruction per two values) and Q's A fragments
//     are loaded in the same permuted order; FP8 V too: P V needs V transposed, so ldmatrix.trans
//     reads the rows as 16-bit pairs of dims — a lane gets (key 2c, dims 2e and 2e + 1) and
//     (key 2c + 1, the same dims), one byte permutation makes them (keys 2c and 2c + 1, dim 2e)
//     and (the same keys, dim 2e + 1), the B fragments of an even-dim and an odd-dim n-tile, each
//     converted by one instruction; O's columns come out in that order and the merge puts them
//     back (TcDim<true>). No fp16 copy of V: an FP8 CTA takes ~72 KB, three an SM;
//   - O and l are rescaled only when a row's running max grew (the correction factor is
//     exactly 1 otherwise); scores in log2 units, P by one ex2 instruction; keys masked only in a
//     group that straddles the split's ends;
//   - an FP8 cache at GQA <= 8 takes the transposed form (kT, QkT / PvT below): S^T = K Q^T and
//     O^T += V^T P^T with keys and dims as the m16 rows, the heads as n8 — no padding rows, half
//     the mmas and scores (ncu at 1 x 128K, with the changes above: 20.7 M -> 12.4 M instructions,
//     42.6 -> 59.4 % of DRAM bandwidth). MOESHARD_ATTN_DECODE_T=0 keeps the plain form.
// MOESHARD_ATTN_DECODE_SPLIT=0 (or SetAttentionDecodeSplitKernel(0)) runs attention_decode_tc.cu's
// split kernel instead.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp8.h>

#include <atomic>
#include <cstdlib>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_decode_tc.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/tensor_map.cuh"
#include "kernels/cuda/pdl.cuh"

namespace moeshard::gpu {
namespace {

constexpr int kThreads = 128, kWarps = 4, kKeys = 16, kStride = kWarps * kKeys, kRows = kTcRows;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// A warp's stage: its 16 keys' K rows, then their V rows, each [16][head_dim] as the tensor map's
// box(es) write them — 128-byte rows (bf16 head_dim 64, FP8 head_dim 128) and bf16 head_dim
// 128's two 64-dim halves in the 128-byte swizzle (16-byte piece j of row r at j ^ (r % 8));
// FP8 head_dim 64's 64-byte rows plain. FP8's K and V scales of the stage sit in a region of
// their own (so that a stage stays a multiple of 1,024 bytes).
template <int HD, KvElem E>
struct Geo {
  static constexpr bool kFp8 = E == KvElem::kFp8E4M3;
  static constexpr int kRowBytes = kFp8 ? HD : 2 * HD;
  static constexpr bool kSwizzle = kRowBytes >= 128;
  static constexpr int kBoxBytes = kSwizzle ? 128 : kRowBytes;  // a box's row
  static constexpr int kBoxes = kRowBytes / kBoxBytes;          // boxes a K or V tile
  static constexpr int kTile = kKeys * kRowBytes;               // K or V, bytes
  static constexpr int kScales = kFp8 ? 2 * kKeys * 4 : 0;  // a stage's K then V scales
  static constexpr int kStage = 2 * kTile;
  static constexpr int kStages = kFp8 ? 4 : 3;
  static constexpr int kLd = HD + 8;  // fp16/bf16 elements a padded row of Q
  static constexpr int kRing = 0;     // from the 1024-aligned base: warp w's ring at w * kStages * kStage
  static constexpr int kScl = kRing + kWarps * kStages * kStage;  // warp w's stage s's scales
  static constexpr int kQ = kScl + kWarps * kStages * kScales;
  static constexpr int kBars = kQ + kRows * kLd * 2;
  static constexpr int kLoop = kBars + kWarps * kStages * 8;
  static constexpr int kMerge = kTcMergeBytes<HD>;
  static constexpr size_t kSmem = (kLoop > kMerge ? kLoop : kMerge) + 1024;  // + the base's alignment
  static_assert(kTile % 1024 == 0 || !kSwizzle, "swizzled tiles 1024-byte aligned");
  static_assert(kTile % 1024 == 0, "stages 1024-byte aligned");
  static_assert(kQ % 16 == 0 && kBars % 8 == 0, "alignment");
};

// Byte offset of 16-byte piece j (of head_dim * esz / 16) of row r in a K or V tile.
template <int HD, KvElem E>
__device__ __forceinline__ int TileOffset(int r, int j) {
  using G = Geo<HD, E>;
  if constexpr (G::kSwizzle) {
    return (j / 8) * (kKeys * 128) + r * 128 + (((j % 8) ^ (r % 8)) << 4);
  } else {
    return r * G::kRowBytes + j * 16;
  }
}

// The V rows of a warp's stage (keys c0 ..) outside [kb, ke) zeroed by the warp: P is 0 there, and
// 0 times a NaN such a row may hold would not be.
template <int HD, KvElem E>
__device__ __forceinline__ void ZeroVRowsOutside(uint8_t* vst, int c0, int kb, int ke, int lane) {
  constexpr int kPieces = Geo<HD, E>::kRowBytes / 16;
  for (int i = lane; i < kKeys * kPieces; i += 32) {
    const int row = i / kPieces, piece = i % kPieces;
    if (c0 + row < kb || c0 + row >= ke) {
      *reinterpret_cast<uint4*>(vst + TileOffset<HD, E>(row, piece)) = make_uint4(0, 0, 0, 0);
    }
  }
  __syncwarp();
}

__device__ __forceinline__ void FenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

__device__ __forceinline__ void LdMatrixX4Addr(uint32_t a, uint32_t (&r)[4], bool trans) {
  if (trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  }
}

// The transposed form (kT: an FP8 cache, at most 8 query heads a KV head): S^T = K Q^T and
// O^T += V^T P^T, with a warp's 16 keys (and 16 of O's dims) as the m16 rows of the mmas and
// the group's query heads as the n8 columns, so no mma row is padding (the plain form's m16
// tile of query heads is half padding at GQA 8) — half the mmas, and each lane holds 4 scores
// instead of 8. Lane (gq, cq) = (lane / 4, lane % 4).

// 8 x 8 b16 matrix transposed across the warp (each lane's word: row lane / 4, columns
// 2 (lane % 4) and + 1).
__device__ __forceinline__ uint32_t MovTrans(uint32_t x) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(x));
  return r;
}

// S^T of a warp's stage: s[0..1] key gq, heads 2 cq and + 1; s[2..3] key gq + 8. The contraction
// order is free: k-step ks of lane (gq, cq) covers dims cq * HD / 4 + 4 ks .. + 3 of keys gq and
// gq + 8 (the A fragments, one conversion a pair) and of head gq (qb, the B fragments).
template <int HD>
__device__ __forceinline__ void QkT(const uint8_t* kst, const uint32_t (&qb)[HD / 16][2], int gq, int cq,
                                    float (&s)[4]) {
  constexpr int KS = HD / 16;
  uint32_t w[2][KS];
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int j = 0; j < KS / 4; ++j) {
      const uint4 x = *reinterpret_cast<const uint4*>(kst + TileOffset<HD, KvElem::kFp8E4M3>(n * 8 + gq, cq * (KS / 4) + j));
      w[n][4 * j] = x.x;
      w[n][4 * j + 1] = x.y;
      w[n][4 * j + 2] = x.z;
      w[n][4 * j + 3] = x.w;
    }
  }
  s[0] = s[1] = s[2] = s[3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    const uint32_t a[4] = {E4m3HalfToF16x2<0>(w[0][ks]), E4m3HalfToF16x2<0>(w[1][ks]), E4m3HalfToF16x2<1>(w[0][ks]),
                           E4m3HalfToF16x2<1>(w[1][ks])};
    Mma<true>(s, a, qb[ks][0], qb[ks][1]);
  }
}

// O^T += V^T P^T for a warp's stage (pb: P^T's B fragments). ldmatrix.trans reads V's rows as
// 16-bit pairs of dims: matrix x4 i of 32-dim slab q gives lane (gq, cq) keys 2 cq and + 1 (+ 8
// for i = 1, 3) of dim pair gq (+ 8 for i = 2, 3); one byte permutation a word makes its low half
// those keys at the even dim and its high half at the odd one — the A fragments of two m16 tiles:
// tile 2 q + odd, row r < 8 is dim 32 q + 2 r + odd and row r + 8 dim 32 q + 16 + 2 r + odd (TDim).
template <int HD>
__device__ __forceinline__ void PvT(uint32_t vbase, int lane, uint32_t pb0, uint32_t pb1, float (&o)[HD / 16][4]) {
  const int vrow = lane % 8 + ((lane / 8) % 2) * 8;
#pragma unroll
  for (int q = 0; q < HD / 32; ++q) {
    uint32_t b[4];
    LdMatrixX4Addr(vbase + TileOffset<HD, KvElem::kFp8E4M3>(vrow, 2 * q + lane / 16), b, true);
    uint32_t x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = __byte_perm(b[i], 0, 0x3120);
    const uint32_t even[4] = {E4m3HalfToF16x2<0>(x[0]), E4m3HalfToF16x2<0>(x[2]), E4m3HalfToF16x2<0>(x[1]),
                              E4m3HalfToF16x2<0>(x[3])};
    const uint32_t odd[4] = {E4m3HalfToF16x2<1>(x[0]), E4m3HalfToF16x2<1>(x[2]), E4m3HalfToF16x2<1>(x[1]),
                             E4m3HalfToF16x2<1>(x[3])};
    Mma<true>(o[2 * q], even, pb0, pb1);
    Mma<true>(o[2 * q + 1], odd, pb0, pb1);
  }
}

// The running maxima m (log2 units) of a lane's two rows or heads after a group whose maxima are
// mx: m_use = the new maxima (0 for one still at -inf, so that P = 2^(s - m_use) is 0 there); when
// any lane's grew, l times the correction factors 2^(m - m_use), those in corr, and true (O wants
// them too). A maximum that did not grow has the factor 2^0 = 1: skipping it changes nothing.
__device__ __forceinline__ bool UpdateRunningMax(float (&m)[2], const float (&mx)[2], float (&m_use)[2], float (&l)[2],
                                                 float (&corr)[2]) {
  bool grew = false;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = fmaxf(m[i], mx[i]);
    grew |= m_new != m[i];
    m_use[i] = m_new == -INFINITY ? 0.f : m_new;
  }
  const bool any = __any_sync(0xffffffffu, grew);
  if (any) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      corr[i] = Ex2Ftz(m[i] - m_use[i]);
      l[i] *= corr[i];
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) m[i] = fmaxf(m[i], mx[i]);
  return any;
}

// The head dim of row r (< 16) of O^T's m16 tile i.
__device__ __forceinline__ int TDim(int i, int r) { return (i / 2) * 32 + (r / 8) * 16 + 2 * (r % 8) + (i % 2); }

template <int HD, KvElem E, bool kT>
__global__ void __launch_bounds__(kThreads, E == KvElem::kFp8E4M3 ? 3 : 2)
    DecodeSplitKernel(AttentionParams p, int group, int splits, float* ws, const __grid_constant__ CUtensorMap kmap,
                      const __grid_constant__ CUtensorMap vmap) {
  using G = Geo<HD, E>;
  constexpr bool F16 = G::kFp8;  // the mmas on fp16 operands (FP8 values are exact in fp16)
  constexpr int LD = G::kLd, KS = HD / 16, S = G::kStages;
  extern __shared__ float4 smem4[];
  // The swizzled boxes need 1024-byte aligned tiles: the layout starts at the first such address
  // (by pointer arithmetic, so the compiler keeps the shared address space: a round trip through
  // an integer made every access to the layout a generic 64-bit one).
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem4) + ((1024 - (reinterpret_cast<uintptr_t>(smem4) & 1023)) & 1023);
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem + G::kQ);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, cq = lane & 3;
  const int64_t t = blockIdx.z, g = blockIdx.y, sp = blockIdx.x;
  const int64_t nkv = p.cache.num_kv_heads, H = p.num_heads;
  const int bs = static_cast<int>(p.cache.block_size);
  // The split and its block-table entries are step inputs (uploaded before the step).
  const DecodeSplit split = DecodeSplitOf(p, t, sp, splits, ws);
  // Positions fit in 32 bits (DecodeSplitSupports: the cache's slots do).
  const int kb = static_cast<int>(split.kb), ke = static_cast<int>(split.ke);
  const float scale_log2 = p.scale * kLog2e;
  const int32_t* table = p.block_tables + p.table_offset[t];
  if (kb < ke) {
    for (int b = kb / bs + tid; b <= (ke - 1) / bs; b += kThreads) PrefetchL1(table + b);
  }
  if (tid == 0) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(&kmap) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(&vmap) : "memory");
  }
  PdlWait();
  PdlTrigger();
  if (kb >= ke) return MarkEmptySplit(p, split, t, g, group, sp, splits, tid);

  // This warp's keys: the 16-key groups [k0 + 64 c, + 16) that start before ke (k0 a multiple of
  // 16: keys before kb in the first group are masked like those from ke on in the last).
  const int k0 = (kb & ~15) + kKeys * warp;
  const int nc = k0 < ke ? (ke - k0 + kStride - 1) / kStride : 0;
  const int bshift = (bs & (bs - 1)) == 0 ? __ffs(bs) - 1 : -1;  // a power-of-two block size: a shift
  uint8_t* ring = smem + G::kRing + warp * S * G::kStage;
  uint8_t* scl = smem + G::kScl + warp * S * G::kScales;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + G::kBars) + warp * S;
  if (lane == 0) {
    // Lane 0's arrival with the boxes' bytes, and (FP8) every lane's on its scale copy.
    for (int s = 0; s < S; ++s) MbarrierInit(full + s, F16 ? 1 + 32 : 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  const int r = lane & 15;
  const float* scales = lane >= 16 ? p.cache.v_scale : p.cache.k_scale;
  // Group c's block-table entry (every lane loads it: one broadcast): the loops load the entry of
  // the group they will issue next before they wait for the current one.
  auto entry = [&](int c) {
    const int c0 = k0 + c * kStride;
    return c < nc ? table[bshift >= 0 ? c0 >> bshift : c0 / bs] : 0;
  };
  // Group c (its block-table entry `e`) into ring slot `slot`: lane 0 the K and V boxes (16
  // consecutive slots of a block, one KV head); FP8: lane r < 16 key r's K scale, 16 + r its V
  // scale (zero past the keys).
  auto issue = [&](int c, int slot, int e) {
    uint8_t* st = ring + slot * G::kStage;
    const int c0 = k0 + c * kStride;
    const int b = bshift >= 0 ? c0 >> bshift : c0 / bs;
    const int slot0 = e * bs + (c0 - b * bs);
    if (lane == 0) {
      MbarrierArriveExpectTx(full + slot, 2 * G::kTile);
#pragma unroll
      for (int x = 0; x < G::kBoxes; ++x) {
        const int xe = x * G::kBoxBytes / (F16 ? 1 : 2);
        TensorCopy3dToShared(st + x * kKeys * G::kBoxBytes, &kmap, xe, static_cast<int>(g), slot0, full + slot);
        TensorCopy3dToShared(st + G::kTile + x * kKeys * G::kBoxBytes, &vmap, xe, static_cast<int>(g), slot0,
                             full + slot);
      }
    }
    if constexpr (F16) {
      const int kp = c0 + r;
      float* sc = reinterpret_cast<float*>(scl + slot * G::kScales) + (lane >= 16 ? kKeys : 0) + r;
      CpAsync4(sc, scales + (static_cast<int64_t>(slot0) + r) * nkv + g, kp >= kb && kp < ke);
      MbarrierArriveOnCpAsync(full + slot);
    }
  };
  for (int c = 0; c < S && c < nc; ++c) issue(c, c, entry(c));

  // Q rows (the group's heads), zero past the group; fp16 for an FP8 cache. 16 bytes a load where
  // the rows are 16-byte aligned (one load a thread at GQA 8, head_dim 128).
  const int64_t q_stride = p.q_stride ? p.q_stride : H * HD;
  const uint16_t* q = static_cast<const uint16_t*>(p.q) + t * q_stride + g * group * HD;
  if ((reinterpret_cast<uintptr_t>(q) & 15) == 0) {
    for (int i = tid; i < kRows * HD / 8; i += kThreads) {
      const int row = i / (HD / 8), d = (i % (HD / 8)) * 8;
      uint4 v = row < group ? *reinterpret_cast<const uint4*>(q + row * HD + d) : make_uint4(0, 0, 0, 0);
      if constexpr (F16) {
        uint32_t* w = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const __half2 h = __floats2half2_rn(DevBf16ToF32(static_cast<uint16_t>(w[j] & 0xffffu)),
                                              DevBf16ToF32(static_cast<uint16_t>(w[j] >> 16)));
          w[j] = *reinterpret_cast<const uint32_t*>(&h);
        }
      }
      *reinterpret_cast<uint4*>(Qs + row * LD + d) = v;
    }
  } else {
    for (int i = tid; i < kRows * HD; i += kThreads) {
      const int row = i / HD, d = i % HD;
      uint16_t v = row < group ? q[row * HD + d] : uint16_t{0};
      if constexpr (F16) {
        const __half h = __float2half_rn(DevBf16ToF32(v));
        v = *reinterpret_cast<const uint16_t*>(&h);
      }
      Qs[row * LD + d] = v;
    }
  }
  __syncthreads();
  if constexpr (kT) {
    static_assert(F16, "the transposed form is for an FP8 cache");
    uint32_t qb[KS][2];  // head gq's dims cq * HD / 4 + 4 ks .. + 3 (zero past the group)
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const uint2 v = *reinterpret_cast<const uint2*>(Qs + gq * LD + cq * (HD / 4) + 4 * ks);
      qb[ks][0] = v.x;
      qb[ks][1] = v.y;
    }
    float o[HD / 16][4];
#pragma unroll
    for (int i = 0; i < HD / 16; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // heads 2 cq and 2 cq + 1 (l: this lane's keys)
    // Group c in ring slot `slot` (a constant: the loop below is unrolled by the ring's length, so
    // the stage's addresses are offsets the compiler folds).
    auto step = [&](int c, int slot) {
      const int next = entry(c + S);  // before the wait: its latency under this group's work
      MbarrierWait(full + slot, static_cast<uint32_t>((c / S) & 1));
      uint8_t* st = ring + slot * G::kStage;
      uint8_t* vst = st + G::kTile;
      const float* kscale = reinterpret_cast<const float*>(scl + slot * G::kScales);
      const float* vscale = kscale + kKeys;
      const int c0 = k0 + c * kStride;
      const bool edge = c0 < kb || c0 + kKeys > ke;
      float s[4];
      QkT<HD>(st, qb, gq, cq, s);
      // Log2 units (P = 2^(s - m) by one instruction); keys outside [kb, ke) only in an edge group.
      const float sa = scale_log2 * kscale[gq], sb = scale_log2 * kscale[gq + 8];
      s[0] *= sa;
      s[1] *= sa;
      s[2] *= sb;
      s[3] *= sb;
      if (edge) {
        if (c0 + gq < kb || c0 + gq >= ke) s[0] = s[1] = -INFINITY;
        if (c0 + gq + 8 < kb || c0 + gq + 8 >= ke) s[2] = s[3] = -INFINITY;
      }
      float mx[2] = {fmaxf(s[0], s[2]), fmaxf(s[1], s[3])};
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int o8 = 4; o8 < 32; o8 <<= 1) mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], o8));
      }
      float m_use[2], corr[2];
      if (UpdateRunningMax(m, mx, m_use, l, corr)) {
#pragma unroll
        for (int i = 0; i < HD / 16; ++i) {
          o[i][0] *= corr[0];
          o[i][1] *= corr[1];
          o[i][2] *= corr[0];
          o[i][3] *= corr[1];
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) s[j] = Ex2Ftz(s[j] - m_use[j % 2]);
      l[0] += s[0] + s[2];
      l[1] += s[1] + s[3];
      const float va = vscale[gq], vb = vscale[gq + 8];
      // P^T's B fragments: P's words (key gq or gq + 8, heads 2 cq and + 1) transposed.
      const uint32_t pb0 = MovTrans(Pack<true>(s[0] * va, s[1] * va)), pb1 = MovTrans(Pack<true>(s[2] * vb, s[3] * vb));
      if (edge) ZeroVRowsOutside<HD, E>(vst, c0, kb, ke, lane);
      PvT<HD>(SharedAddr(vst), lane, pb0, pb1, o);
      __syncwarp();  // every lane is done with the slot
      if (c + S < nc) {
        FenceProxyAsync();
        issue(c + S, slot, next);
      }
    };
#pragma unroll 1
    for (int c = 0; c < nc; c += S) {
#pragma unroll
      for (int slot = 0; slot < S; ++slot) {
        if (c + slot < nc) step(c + slot, slot);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int o8 = 4; o8 < 32; o8 <<= 1) l[i] += __shfl_xor_sync(0xffffffffu, l[i], o8);
    }
    __syncthreads();  // the rings are reused for the merge
    float* Ow = reinterpret_cast<float*>(smem);  // [warp][head][HD], then m and l [warp][head]
    float* Mw = Ow + kWarps * kRows * HD;
    float* Lw = Mw + kWarps * kRows;
#pragma unroll
    for (int i = 0; i < HD / 16; ++i) {
      const int da = TDim(i, gq), db = TDim(i, gq + 8);
      Ow[(warp * kRows + 2 * cq) * HD + da] = o[i][0];
      Ow[(warp * kRows + 2 * cq + 1) * HD + da] = o[i][1];
      Ow[(warp * kRows + 2 * cq) * HD + db] = o[i][2];
      Ow[(warp * kRows + 2 * cq + 1) * HD + db] = o[i][3];
    }
    if (gq == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        Mw[warp * kRows + 2 * cq + i] = m[i] * kLn2;  // natural-log units, what the merges take
        Lw[warp * kRows + 2 * cq + i] = l[i];
      }
    }
    __syncthreads();
    MergeWarpRows<HD, false>(p, split, t, g, group, sp, splits, smem, nullptr);
    return;
  }
  uint32_t qa[KS][4];
  if constexpr (F16) {
    // k-step ks of lane (g, c) covers dims c * HD / 4 + 4 ks .. + 3: K's bytes in the same order.
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const int d = cq * (HD / 4) + 4 * ks;
      const uint2 lo = *reinterpret_cast<const uint2*>(Qs + gq * LD + d);
      const uint2 hi = *reinterpret_cast<const uint2*>(Qs + (gq + 8) * LD + d);
      qa[ks][0] = lo.x;
      qa[ks][2] = lo.y;
      qa[ks][1] = hi.x;
      qa[ks][3] = hi.y;
    }
  } else {
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) LdMatrixX4(Qs + (lane % 16) * LD + ks * 16 + (lane / 16) * 8, qa[ks]);
  }

  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows gq and gq + 8

#pragma unroll 1
  for (int c = 0; c < nc; ++c) {
    const int slot = c % S;
    const int next = entry(c + S);
    MbarrierWait(full + slot, static_cast<uint32_t>((c / S) & 1));
    uint8_t* st = ring + slot * G::kStage;
    const uint8_t* kst = st;
    uint8_t* vst = st + G::kTile;
    const float* kscale = reinterpret_cast<const float*>(scl + slot * G::kScales);
    const float* vscale = kscale + kKeys;
    const int c0 = k0 + c * kStride;
    const bool edge = c0 < kb || c0 + kKeys > ke;  // keys outside [kb, ke): rows that may hold anything

    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    if constexpr (F16) {
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const int row = n * 8 + gq;
        uint32_t w[KS];
#pragma unroll
        for (int j = 0; j < KS / 4; ++j) {  // pieces cq * KS / 4 + j of the row (HD / 4 bytes a lane)
          const uint4 x = *reinterpret_cast<const uint4*>(kst + TileOffset<HD, E>(row, cq * (KS / 4) + j));
          w[4 * j] = x.x;
          w[4 * j + 1] = x.y;
          w[4 * j + 2] = x.z;
          w[4 * j + 3] = x.w;
        }
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) Mma<true>(s[n], qa[ks], E4m3HalfToF16x2<0>(w[ks]), E4m3HalfToF16x2<1>(w[ks]));
      }
    } else {
      const uint32_t kbase = SharedAddr(kst);
      const int row = lane % 8 + (lane / 16) * 8;
#pragma unroll
      for (int k = 0; k < KS; ++k) {
        uint32_t b[4];
        LdMatrixX4Addr(kbase + TileOffset<HD, E>(row, 2 * k + (lane / 8) % 2), b, false);
        Mma<false>(s[0], qa[k], b[0], b[1]);
        Mma<false>(s[1], qa[k], b[2], b[3]);
      }
    }
    // Scores in log2 units (scale_log2 = the softmax scale times log2(e)): P = 2^(s - m) by one
    // instruction. Only a group that straddles kb or ke is masked.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float sc = scale_log2;
        if constexpr (F16) sc *= kscale[n * 8 + 2 * cq + (j % 2)];
        s[n][j] *= sc;
        if (edge) {
          const int key = c0 + n * 8 + 2 * cq + (j % 2);
          if (key < kb || key >= ke) s[n][j] = -INFINITY;
        }
        mx[j / 2] = fmaxf(mx[j / 2], s[n][j]);
      }
    }
    mx[0] = QuadMax(mx[0]);
    mx[1] = QuadMax(mx[1]);
    float m_use[2], corr[2];
    if (UpdateRunningMax(m, mx, m_use, l, corr)) RescaleO<HD>(o, corr);
    // P = 2^(s - m_use) (its rows' sums into l), then (FP8) times V's scale, as the A fragments of P V.
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[n][j] = Ex2Ftz(s[n][j] - m_use[j / 2]);
        l[j / 2] += s[n][j];
        if constexpr (F16) s[n][j] *= vscale[n * 8 + 2 * cq + (j % 2)];
      }
    }
    uint32_t pa[4];
    pa[0] = Pack<F16>(s[0][0], s[0][1]);
    pa[1] = Pack<F16>(s[0][2], s[0][3]);
    pa[2] = Pack<F16>(s[1][0], s[1][1]);
    pa[3] = Pack<F16>(s[1][2], s[1][3]);
    if (edge) ZeroVRowsOutside<HD, E>(vst, c0, kb, ke, lane);
    const uint32_t vbase = SharedAddr(vst);
    const int vrow = lane % 8 + ((lane / 8) % 2) * 8;
    if constexpr (F16) {
      // 32 dims (16 pairs) at a time: b[0] (keys 2c, 2c + 1 of 0-7), b[1] (of 8-15) for pairs
      // 16 q + g, b[2] and b[3] for pairs 16 q + 8 + g; each word's bytes (k, d) (k, d+1)
      // (k+1, d) (k+1, d+1) permuted to (k, d) (k+1, d) (k, d+1) (k+1, d+1).
#pragma unroll
      for (int q = 0; q < HD / 32; ++q) {
        uint32_t b[4];
        LdMatrixX4Addr(vbase + TileOffset<HD, E>(vrow, 2 * q + lane / 16), b, true);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t x0 = __byte_perm(b[2 * h], 0, 0x3120), x1 = __byte_perm(b[2 * h + 1], 0, 0x3120);
          Mma<true>(o[4 * q + 2 * h], pa, E4m3HalfToF16x2<0>(x0), E4m3HalfToF16x2<0>(x1));
          Mma<true>(o[4 * q + 2 * h + 1], pa, E4m3HalfToF16x2<1>(x0), E4m3HalfToF16x2<1>(x1));
        }
      }
    } else {
#pragma unroll
      for (int d = 0; d < HD / 16; ++d) {
        uint32_t b[4];
        LdMatrixX4Addr(vbase + TileOffset<HD, E>(vrow, 2 * d + lane / 16), b, true);
        Mma<false>(o[2 * d], pa, b[0], b[1]);
        Mma<false>(o[2 * d + 1], pa, b[2], b[3]);
      }
    }
    __syncwarp();  // every lane is done with the slot
    if (c + S < nc) {
      FenceProxyAsync();  // this warp's accesses to the slot before the copies that overwrite it
      issue(c + S, slot, next);
    }
  }
  // m back in natural-log units, what the merges take (l is the same sum in either).
  m[0] *= kLn2;
  m[1] *= kLn2;
  __syncthreads();  // the rings are reused for the merge
  MergeTcWarps<HD, false, F16>(p, split, t, g, group, sp, splits, smem, nullptr, o, m, l);
}

std::atomic<int> split_mode{-1};  // SetAttentionDecodeSplitKernel

bool SplitOn() {
  static const bool env_on = [] {
    const char* v = std::getenv("MOESHARD_ATTN_DECODE_SPLIT");
    return !(v && v[0] == '0');
  }();
  const int mode = split_mode.load(std::memory_order_relaxed);
  return mode < 0 ? env_on : mode == 1;
}

// MOESHARD_ATTN_DECODE_T=0: an FP8 cache at GQA <= 8 takes the plain form too.
bool TransposedOn() {
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_ATTN_DECODE_T");
    return !(v && v[0] == '0');
  }();
  return on;
}

template <int HD, KvElem E, bool kT>
cudaError_t Prepare(std::atomic<uint64_t>& smem_set) {
  return EnsureDynamicSmem(&DecodeSplitKernel<HD, E, kT>, Geo<HD, E>::kSmem, smem_set);
}

// The K or V cache as a 3-D tensor [slots][KV heads][head_dim]; a box is 16 consecutive slots of
// one head, 128 bytes of each row (swizzled) or the whole 64-byte row.
template <int HD, KvElem E>
cudaError_t EncodeKvMap(const void* base, const KvCacheView& c, CUtensorMap* map) {
  using G = Geo<HD, E>;
  constexpr int esz = G::kFp8 ? 1 : 2;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(HD), static_cast<cuuint64_t>(c.num_kv_heads),
                              static_cast<cuuint64_t>(c.num_blocks * c.block_size)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(HD * esz), static_cast<cuuint64_t>(c.num_kv_heads * HD * esz)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(G::kBoxBytes / esz), 1, kKeys}, elem[3] = {1, 1, 1};
  const CUresult r =
      TensorMapEncoder()(map, G::kFp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_UINT16, 3,
                         const_cast<void*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                         G::kSwizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <int HD, KvElem E, bool kT>
cudaError_t LaunchHd(const AttentionParams& p, int splits, cudaStream_t st) {
  static std::atomic<uint64_t> smem_set{0};
  if (cudaError_t e = Prepare<HD, E, kT>(smem_set); e != cudaSuccess) return e;
  CUtensorMap kmap, vmap;  // host encoding only (microseconds): the launch (or graph node) copies them
  if (cudaError_t e = EncodeKvMap<HD, E>(p.cache.k, p.cache, &kmap); e != cudaSuccess) return e;
  if (cudaError_t e = EncodeKvMap<HD, E>(p.cache.v, p.cache, &vmap); e != cudaSuccess) return e;
  const int group = static_cast<int>(p.num_heads / p.cache.num_kv_heads);
  float* ws = splits > 1 ? static_cast<float*>(p.workspace) : nullptr;
  dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(p.cache.num_kv_heads),
            static_cast<unsigned>(p.num_tokens));
  return LaunchPdl(&DecodeSplitKernel<HD, E, kT>, grid, kThreads, Geo<HD, E>::kSmem, st, p, group, splits, ws, kmap,
                   vmap);
}

// The plain form's (the transposed one's launch bounds and shared memory are the same).
template <int HD, KvElem E>
cudaError_t Occupancy(int* n) {
  static std::atomic<uint64_t> smem_set{0};
  if (cudaError_t e = Prepare<HD, E, false>(smem_set); e != cudaSuccess) return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, &DecodeSplitKernel<HD, E, false>, kThreads,
                                                       Geo<HD, E>::kSmem);
}

}  // namespace

void SetAttentionDecodeSplitKernel(int mode) { split_mode.store(mode < 0 ? -1 : (mode ? 1 : 0)); }

bool DecodeSplitSupports(const AttentionParams& p) {
  static const bool sm90 = DeviceIsSm90OrNewer();  // bulk copies and mbarrier transaction counts
  static const bool maps = TensorMapEncoder() != nullptr;
  const int64_t hd = p.cache.head_dim, bs = p.cache.block_size;
  return SplitOn() && sm90 && maps && DecodeTcSupports(p) && (hd == 64 || hd == 128) && bs > 0 && bs % kKeys == 0 &&
         p.cache.num_blocks > 0 && p.cache.num_blocks * bs <= (int64_t{1} << 31) - 1;
}

int DecodeSplitCtasPerSm(const AttentionParams& p) {
  static std::atomic<int> cached[4];
  return CachedCtasPerSm(cached, p.cache.head_dim == 64, p.cache.elem == KvElem::kFp8E4M3,
                         [](bool hd64, bool fp8, int* n) {
                           if (hd64) return fp8 ? Occupancy<64, KvElem::kFp8E4M3>(n) : Occupancy<64, KvElem::kBF16>(n);
                           return fp8 ? Occupancy<128, KvElem::kFp8E4M3>(n) : Occupancy<128, KvElem::kBF16>(n);
                         });
}

cudaError_t LaunchAttentionDecodeSplit(const AttentionParams& p, int64_t splits, cudaStream_t st) {
  const int s = static_cast<int>(splits);
  const bool hd64 = p.cache.head_dim == 64;
  if (p.cache.elem != KvElem::kFp8E4M3) return hd64 ? LaunchHd<64, KvElem::kBF16, false>(p, s, st) : LaunchHd<128, KvElem::kBF16, false>(p, s, st);
  if (TransposedOn() && p.num_heads <= 8 * p.cache.num_kv_heads) {
    return hd64 ? LaunchHd<64, KvElem::kFp8E4M3, true>(p, s, st) : LaunchHd<128, KvElem::kFp8E4M3, true>(p, s, st);
  }
  return hd64 ? LaunchHd<64, KvElem::kFp8E4M3, false>(p, s, st) : LaunchHd<128, KvElem::kFp8E4M3, false>(p, s, st);
}

}  // namespace moeshard::gpu
