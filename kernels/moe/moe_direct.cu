// The direct decode GEMV of the MoE step (MoeWork::direct: ≤ kMoeDirectMaxPairs pairs, one
// token per pair). The first version (moe_gemv.cu GemvDirectKernel) ran at 5× the copy floor
// (ncu, 2026-12-03, one stream: gate/up 13.6 µs for 13.4 MB): ~3,960 instructions a warp for
// 8.7 KB of MXFP4, 2.7 warps a scheduler, and its activation loads queued behind ten 16-byte
// cp.async a lane; half of every warp's time went to waiting on global memory.
//
// Same tasks, same split K, same sums in the same order as GemvDirectKernel (so the results are
// bit for bit those of the first version and of the grouped kernels: moe_expert_test checks it);
// what changes is how a lane gets there:
//   - a block is 8 warps, one 16-row slice × one quarter of K each (the first version: 4 warps
//     of 32 rows): twice the warps to hide latency, 64 registers;
//   - weights are staged two chunks deep by the copy engine: one 1-D bulk copy (cp.async.bulk,
//     mbarrier-counted) per row and chunk instead of ten 16-byte cp.async a lane, so the
//     activation loads do not wait behind them; shared memory is read with plain 32-bit loads;
//   - a block's 17- or 34-byte blocks sit at a byte phase that is the same for all rows of a
//     warp whenever the row stride and the gate/up bases agree mod 4 (every real checkpoint:
//     K % 128 == 0): the phase is then a template argument and each code word is one or two
//     LDS at constant offsets with a constant funnel shift; other layouts take the same code
//     with the phase at run time (kPhase = -1);
//   - the activations (x for gate/up, h for down) are staged per chunk in shared memory already
//     in the mma's B-fragment order (one LDS.128 per 32 columns), loaded one chunk ahead;
//   - MXFP4: the e2m1 codes go into bf16 as e2m1 · 2^-126 (code 1, 0.5, is the subnormal
//     2^-127) without the bf16 multiply by 2^126 of the first version; instead the staged
//     activations carry 2^64 and the block scale 2^62 (kSubnormal, MOESHARD_MOE_SUBNORMAL=0
//     off): the products are the same numbers times 2^-62, exact, so the sums are too as long
//     as the tensor cores keep bf16 subnormal inputs (they do: moe_expert_test's bit-for-bit
//     comparison passes on the H200). A block scale above 2^65 (e8m0 > 192) saturates to inf.
// Instructions a warp for the same 8.7 KB: ~1,900 (SASS: ~46 a 32-column block of 16 rows).

#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/moe/moe_device.cuh"
#include "kernels/moe/moe_env.h"
#include "kernels/moe/moe_launch.h"

namespace moeshard::gpu {
namespace {

// A block: 8 warps = 2 slices of 16 rows (gate and up; or down's two halves) × 4 quarters of K.
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kSliceRows = 16;                       // rows a warp stages and multiplies
constexpr int kChunkBytes = 136;                     // whole blocks of both formats (8 MXFP4, 4 Q8_0)
constexpr int kSlot16 = (15 + kChunkBytes + 15) / 16;
constexpr int kSlotBytes = 16 * kSlot16;             // one row's chunk + its alignment
constexpr int kStageBytes = kSliceRows * kSlotBytes;  // one warp, one chunk
constexpr int kMaxKc = 8;                            // blocks per chunk (MXFP4)
constexpr int kBBytes = kMaxKc * 4 * 16;             // one warp's B fragments of one chunk
constexpr int kBarOffset = kWarps * (2 * kStageBytes + kBBytes) + 16;  // reads may run 16 bytes past a slot
constexpr int kSmemBytes = kBarOffset + kWarps * 2 * 8;                 // two mbarriers a warp
constexpr int kMinBlocks = 4;

extern __shared__ __align__(16) uint8_t smem[];  // offsets below are into this

__device__ __forceinline__ uint64_t* SmemBar(uint32_t off) { return reinterpret_cast<uint64_t*>(smem + off); }
// Plain loads at byte offsets into smem (the compiler schedules them; the mbarrier waits and
// __syncwarp order them against the copies).
__device__ __forceinline__ uint32_t Lds32(uint32_t off) { return *reinterpret_cast<const uint32_t*>(smem + off); }
__device__ __forceinline__ uint32_t Lds8(uint32_t off) { return smem[off]; }
__device__ __forceinline__ uint32_t Lds16(uint32_t off) { return *reinterpret_cast<const uint16_t*>(smem + off); }
__device__ __forceinline__ uint4 Lds128(uint32_t off) { return *reinterpret_cast<const uint4*>(smem + off); }
__device__ __forceinline__ void Sts128(uint32_t off, uint4 v) { *reinterpret_cast<uint4*>(smem + off) = v; }
// The 4 bytes at shared byte address `base + kOff` where `base` ≡ kPhase (mod 4); kPhase < 0:
// any address (the phase read at run time).
template <int kPhase, int kOff>
__device__ __forceinline__ uint32_t LdsWord(uint32_t base) {
  if constexpr (kPhase >= 0) {
    constexpr int s = (kPhase + kOff) & 3, lo = kOff - s;  // base - kPhase is 4-aligned
    const uint32_t a = base + static_cast<uint32_t>(lo);  // 4-aligned
    if constexpr (s == 0) {
      return Lds32(a);
    } else {
      return __funnelshift_r(Lds32(a), Lds32(a + 4), 8 * s);
    }
  } else {
    const uint32_t a = base + kOff;
    return __funnelshift_r(Lds32(a & ~3u), Lds32((a & ~3u) + 4), 8 * (a & 3));
  }
}

// f16 bits → fp32 (exact for every finite value, subnormals too).
__device__ __forceinline__ float F16BitsToF32(uint32_t h) {
  float f;
  asm("{.reg .b16 t; cvt.u16.u32 t, %1; cvt.f32.f16 %0, t;}" : "=f"(f) : "r"(h));
  return f;
}

template <bool kSubnormal>
__device__ __forceinline__ float E8M0Scale(uint32_t e) {
  if constexpr (kSubnormal) {
    return __uint_as_float(min(e + 62u, 255u) << 23);  // 2^(e-127) · 2^62
  } else {
    return __uint_as_float(max(e << 23, 0x00400000u));  // e = 0: 2^-127
  }
}

// One lane's part of a 16-row slice: rows g and g+8 (h = 0, 1) of block b, decoded into the
// A fragments of the block's two k-steps (a[ks][0..3]) and the rows' scales.
template <WeightFormat F, int kPhase, int kB, bool kSubnormal>
__device__ __forceinline__ void DecodeRows(const uint32_t (&srow)[2], int c, uint32_t (&a)[2][4], float (&sc)[2]) {
  constexpr int BB = Fmt<F>::kBlockBytes;
  if constexpr (F == WeightFormat::kMXFP4) {
    uint32_t o[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sc[h] = E8M0Scale<kSubnormal>(Lds8(srow[h] + BB * kB));
      const uint32_t w = LdsWord<kPhase, BB * kB + 1>(srow[h] + 4 * c);
      constexpr uint32_t kMag = 0x01C001C0u, kSign = 0x80008000u;
      o[h][0] = ((w << 6) & kMag) | ((w << 12) & kSign);  // columns (4c, 4c+2)
      o[h][1] = ((w << 2) & kMag) | ((w << 8) & kSign);   // (16+4c, 18+4c)
      o[h][2] = ((w >> 2) & kMag) | ((w << 4) & kSign);   // (4c+1, 4c+3)
      o[h][3] = ((w >> 6) & kMag) | (w & kSign);          // (17+4c, 19+4c)
      if constexpr (!kSubnormal) {
#pragma unroll
        for (int i = 0; i < 4; ++i) o[h][i] = MulBf16x2(o[h][i], 0x7E807E80u);
      }
    }
    a[0][0] = o[0][0], a[0][1] = o[1][0], a[0][2] = o[0][2], a[0][3] = o[1][2];
    a[1][0] = o[0][1], a[1][1] = o[1][1], a[1][2] = o[0][3], a[1][3] = o[1][3];
  } else {
    uint32_t lo[2][2], hi[2][2];  // [row][k-step]
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t sb = srow[h] + BB * kB;
      if constexpr (kPhase >= 0 && (kPhase & 1) == 0) {
        sc[h] = F16BitsToF32(Lds16(sb));
      } else {
        sc[h] = F16BitsToF32(Lds8(sb) | (Lds8(sb + 1) << 8));
      }
      const uint32_t q0 = LdsWord<kPhase, BB * kB + 2>(srow[h] + 8 * c);
      const uint32_t q1 = LdsWord<kPhase, BB * kB + 6>(srow[h] + 8 * c);
      I8x4ToBf16(q0, lo[h][0], hi[h][0]);
      I8x4ToBf16(q1, lo[h][1], hi[h][1]);
    }
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) a[ks][0] = lo[0][ks], a[ks][1] = lo[1][ks], a[ks][2] = hi[0][ks], a[ks][3] = hi[1][ks];
  }
}

// The activations a lane stages for 32 columns (column quad c) of one token row `src` (bf16):
// MXFP4 x[4c..4c+3] and x[16+4c..19+4c], Q8_0 x[8c..8c+7].
template <WeightFormat F>
__device__ __forceinline__ uint4 LoadBRaw(const uint16_t* src, int c) {
  if constexpr (F == WeightFormat::kMXFP4) {
    const uint2 v0 = __ldcg(reinterpret_cast<const uint2*>(src + 4 * c));
    const uint2 v1 = __ldcg(reinterpret_cast<const uint2*>(src + 16 + 4 * c));
    return uint4{v0.x, v0.y, v1.x, v1.y};
  } else {
    return __ldcg(reinterpret_cast<const uint4*>(src + 8 * c));
  }
}

// LoadBRaw's values as the B fragments of the block's two k-steps, in the order the decode
// pairs the columns (MXFP4: (4c, 4c+2), (4c+1, 4c+3), then the same + 16), times 2^64 with
// kSubnormal.
template <WeightFormat F, bool kSubnormal>
__device__ __forceinline__ uint4 BFragments(uint4 v) {
  if constexpr (F == WeightFormat::kMXFP4) {
    uint4 b{__byte_perm(v.x, v.y, 0x5410), __byte_perm(v.x, v.y, 0x7632), __byte_perm(v.z, v.w, 0x5410),
            __byte_perm(v.z, v.w, 0x7632)};
    if constexpr (kSubnormal) {
      constexpr uint32_t k2p64 = 0x5F805F80u;
      b.x = MulBf16x2(b.x, k2p64), b.y = MulBf16x2(b.y, k2p64), b.z = MulBf16x2(b.z, k2p64), b.w = MulBf16x2(b.w, k2p64);
    }
    return b;
  } else {
    return v;
  }
}

template <WeightFormat F, int kPhase, bool kSubnormal>
struct Task {
  static constexpr int BB = Fmt<F>::kBlockBytes, KC = kChunkBytes / BB;

  // A chunk's blocks [kb0, kb0 + nkb) of this warp's 16 rows into acc.
  __device__ __forceinline__ static void Compute(uint32_t wbuf, uint32_t bbuf, const uint32_t (&lo4)[2], int kb0,
                                                 int nkb, int g, int c, float (&acc)[4]) {
    uint32_t srow[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) srow[h] = wbuf + (g + 8 * h) * kSlotBytes + ((lo4[h] + kb0 * BB) & 15);
    Blocks<0>(srow, bbuf, nkb, c, acc);
  }

  // Blocks kB.. of the chunk, each with its offsets known at compile time.
  template <int kB>
  __device__ __forceinline__ static void Blocks(const uint32_t (&srow)[2], uint32_t bbuf, int nkb, int c,
                                                float (&acc)[4]) {
    if constexpr (kB < KC) {
      if (kB < nkb) {
        Step<kB>(srow, bbuf, c, acc);
        Blocks<kB + 1>(srow, bbuf, nkb, c, acc);
      }
    }
  }

  template <int kB>
  __device__ __forceinline__ static void Step(const uint32_t (&srow)[2], uint32_t bbuf, int c, float (&acc)[4]) {
    const uint4 bq = Lds128(bbuf + (kB * 4 + c) * 16);
    uint32_t a[2][4];
    float sc[2];
    DecodeRows<F, kPhase, kB, kSubnormal>(srow, c, a, sc);
    float t[4];
    MmaBf16Zero(t, a[0][0], a[0][1], a[0][2], a[0][3], bq.x, bq.y);
    MmaBf16(t, a[1][0], a[1][1], a[1][2], a[1][3], bq.z, bq.w);
    acc[0] = fmaf(sc[0], t[0], acc[0]);
    acc[1] = fmaf(sc[0], t[1], acc[1]);
    acc[2] = fmaf(sc[1], t[2], acc[2]);
    acc[3] = fmaf(sc[1], t[3], acc[3]);
  }
};

// This warp's share of one task: K range [kb_begin, kb_end) of the 16 rows from row0 of view
// `v`, into acc (the m16n8 accumulators of one token), as moe_gemv.cu RunTask with one token.
// kPhase: the byte phase mod 4 of block kb_begin in every row (-1: per row, at run time).
template <WeightFormat F, int kPhase, bool kSubnormal, bool kLateWait>
__device__ __forceinline__ void WarpGemv(const WeightRef& v, int64_t row0, const uint16_t* brow, int kb_begin,
                                         int kb_end, float (&acc)[4]) {
  using T = Task<F, kPhase, kSubnormal>;
  constexpr int BB = T::BB, KC = T::KC;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int nchunks = (kb_end - kb_begin + KC - 1) / KC;

  // Staging: lane r < 16 copies row r.
  const uint8_t* rowsrc = v.data + v.col_offset / 32 * BB + (row0 + (lane & 15)) * v.row_stride_bytes;
  // The low 4 address bits of the rows this lane reads in the compute (rows g, g + 8).
  const uint32_t my_lo4 = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(rowsrc)) & 15;
  const uint32_t lo4[2] = {__shfl_sync(0xffffffffu, my_lo4, g), __shfl_sync(0xffffffffu, my_lo4, g + 8)};

  const uint32_t wbase = warp * 2 * kStageBytes;
  const uint32_t bbuf = kWarps * 2 * kStageBytes + warp * kBBytes;
  uint64_t* const bar = SmemBar(kBarOffset + warp * 16);  // buffer i: bar + i
  if (lane == 0) {
    MbarrierInit(bar, 1);
    MbarrierInit(bar + 1, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  if constexpr (!kLateWait) MOESHARD_PROBE_MARK(5);  // the barriers ready (marks only after the wait)
  // One copy a row: its chunk's bytes, widened to 16-byte bounds.
  auto stage = [&](int buf, int kb0) {
    const uint8_t* src = rowsrc + kb0 * BB;
    const uint32_t off = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(src)) & 15;
    const uint32_t bytes = lane < kSliceRows ? (off + min(KC, kb_end - kb0) * BB + 15) & ~15u : 0u;
    const uint32_t total = __reduce_add_sync(0xffffffffu, bytes);
    if (lane == 0) MbarrierArriveExpectTx(bar + buf, total);
    if (lane < kSliceRows) BulkCopyToShared(smem + wbase + buf * kStageBytes + lane * kSlotBytes, src - off, bytes, bar + buf);
  };
  // B: item (block, quad) = (lane / 4, lane % 4); MXFP4 fills all 32, Q8_0 (4 blocks) 16.
  const int bq = lane & 3, bblk = lane >> 2;
  auto load_b = [&](int kb0) -> uint4 {
    if (bblk < KC && kb0 + bblk < kb_end) return LoadBRaw<F>(brow + 32 * (kb0 + bblk), bq);
    return uint4{0, 0, 0, 0};
  };
  auto store_b = [&](uint4 x) {
    if (bblk < KC) Sts128(bbuf + (bblk * 4 + bq) * 16, BFragments<F, kSubnormal>(x));
  };

  if (nchunks > 0) stage(0, kb_begin);
  if constexpr (kLateWait) {
    PdlWait();
    PdlTrigger();
  }
  MOESHARD_PROBE_MARK(0);  // the first chunk's copies issued
  if (nchunks == 0) return;
  const uint4 b0 = load_b(kb_begin);
  if (nchunks > 1) stage(1, kb_begin + KC);
  store_b(b0);
#pragma unroll 1
  for (int ci = 0; ci < nchunks; ++ci) {
    const int kb0 = kb_begin + ci * KC;
    const uint4 bnext = ci + 1 < nchunks ? load_b(kb0 + KC) : uint4{0, 0, 0, 0};
    MbarrierWait(bar + (ci & 1), (ci >> 1) & 1);
    if (ci == 0) MOESHARD_PROBE_MARK(1);  // the first weights arrived
    __syncwarp();
    T::Compute(wbase + (ci & 1) * kStageBytes, bbuf, lo4, kb0, min(KC, kb_end - kb0), g, c, acc);
    __syncwarp();  // every lane is done with this chunk's weights and B
    if (ci + 2 < nchunks) stage(ci & 1, kb0 + 2 * KC);
    if (ci + 1 < nchunks) store_b(bnext);
  }
}

// The phase mod 4 of block kb in every row of both views, or -1 when the rows disagree (a row
// stride or the two bases not congruent mod 4).
__device__ __forceinline__ int WarpPhase(const WeightRef& a, const WeightRef& b, int bb, int kb) {
  const uintptr_t pa = reinterpret_cast<uintptr_t>(a.data) + a.col_offset / 32 * bb;
  const uintptr_t pb = reinterpret_cast<uintptr_t>(b.data) + b.col_offset / 32 * bb;
  if (a.row_stride_bytes % 4 != 0 || b.row_stride_bytes % 4 != 0 || (pa - pb) % 4 != 0) return -1;
  return static_cast<int>((pa + static_cast<uintptr_t>(kb) * bb) & 3);
}

// One task: each warp's GEMV (its own phase), then the split-K sums in quarter order and the
// epilogue, as RunTask (h = bf16(silu(bf16(g)) · bf16(u)); y rows fp32).
template <WeightFormat F, bool kGateUp, bool kSubnormal, bool kLateWait>
__device__ __forceinline__ void RunDirect(const MoeExpertParams& p, const MoeWork& w, const WeightRef& m0,
                                          const WeightRef& m1, int64_t rt, int64_t pair) {
  constexpr int BB = Fmt<F>::kBlockBytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int slice = warp >> 2, quarter = warp & 3;
  const int64_t i0 = rt * (kGateUp ? 16 : 32);
  const int nb = static_cast<int>((kGateUp ? p.width : p.inter) / 32);
  const int kb_begin = quarter * nb / 4, kb_end = (quarter + 1) * nb / 4;
  const WeightRef& v = slice == 0 ? m0 : m1;
  const int64_t row0 = kGateUp ? i0 : i0 + 16 * slice;
  const uint16_t* brow = kGateUp ? static_cast<const uint16_t*>(p.x) + pair / p.top_k * p.width
                                 : static_cast<const uint16_t*>(w.h) + pair * p.inter;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  switch (WarpPhase(m0, m1, BB, kb_begin)) {
#define MOESHARD_PHASE(P)                                                                       \
  case P:                                                                                       \
    WarpGemv<F, P, kSubnormal, kLateWait>(v, row0, brow, kb_begin, kb_end, acc); \
    break;
    MOESHARD_PHASE(0)
    MOESHARD_PHASE(1)
    MOESHARD_PHASE(2)
    MOESHARD_PHASE(3)
#undef MOESHARD_PHASE
    default:
      WarpGemv<F, -1, kSubnormal, kLateWait>(v, row0, brow, kb_begin, kb_end, acc);
      break;
  }
  __syncthreads();  // every warp is done with its staging buffers (each waited for its copies)
  MOESHARD_PROBE_MARK(2);  // every warp's GEMV done

  // red[slice][quarter][q][lane]; warp q < 4 finishes accumulator element q of both slices,
  // summing the quarters in order (RunTask's order: the same floats, the same sums).
  float* red = reinterpret_cast<float*>(smem);
  StoreQuarter(red, slice, quarter, lane, acc);
  __syncthreads();
  const int q = warp;
  if (q >= 4 || c != 0 || (q & 1)) return;  // one token: column 0 of the n8 tile
  const float s[2] = {QuarterSum(red, 0, q, lane), QuarterSum(red, 1, q, lane)};
  const int64_t r = g + ((q & 2) ? 8 : 0);
  if constexpr (kGateUp) {
    const float gv = RoundBf16(s[0]), uv = RoundBf16(s[1]);
    static_cast<uint16_t*>(w.h)[pair * p.inter + i0 + r] = DevF32ToBf16(Silu(gv) * uv);
  } else {
    w.y[pair * p.width + i0 + r] = s[0];
    w.y[pair * p.width + i0 + 16 + r] = s[1];
  }
  MOESHARD_PROBE_MARK(3);  // stored
}

// Block i: (pair i / R, row tile i % R), as GemvDirectKernel. kEarly (down only): the first
// chunk of weights is in flight before the wait (pdl.cuh's rule for memory written two launches
// back covers expert_ids).
template <bool kGateUp, bool kEarly, bool kSubnormal>
__global__ void __launch_bounds__(kThreads, kMinBlocks) DirectKernel(MoeExpertParams p, MoeWork w) {
  constexpr bool kLate = !kGateUp && kEarly;
  int64_t pair, rt;
  const int e = DirectBlockStart<kGateUp, kLate>(p, w, (kGateUp ? p.inter : p.width) / (kGateUp ? 16 : 32), pair, rt);
  if constexpr (!kLate) MOESHARD_PROBE_MARK(4);  // the pair's expert id read
  if (e < 0) return;
  const MoeExpertWeights& ew = p.experts[e];
  const WeightRef& m0 = kGateUp ? ew.gate : ew.down;
  const WeightRef& m1 = kGateUp ? ew.up : ew.down;
  switch (m0.format) {
    case WeightFormat::kQ8_0:
      return RunDirect<WeightFormat::kQ8_0, kGateUp, false, kLate>(p, w, m0, m1, rt, pair);
    case WeightFormat::kMXFP4:
      return RunDirect<WeightFormat::kMXFP4, kGateUp, kSubnormal, kLate>(p, w, m0, m1, rt, pair);
    default:
      if constexpr (kLate) PdlWait();
      return;  // MoeWork::direct_v2 only with Q8_0 and MXFP4 experts
  }
}

template <bool kGateUp, bool kEarly, bool kSubnormal>
cudaError_t LaunchK(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  static const cudaError_t attr = cudaFuncSetAttribute(DirectKernel<kGateUp, kEarly, kSubnormal>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (attr != cudaSuccess) return attr;
  const int64_t R = (kGateUp ? p.inter : p.width) / (kGateUp ? 16 : 32);
  const int64_t grid = std::max<int64_t>(1, p.num_tokens * p.top_k * R);
  return LaunchPdl(DirectKernel<kGateUp, kEarly, kSubnormal>, static_cast<unsigned>(grid), kThreads, kSmemBytes,
                   stream, p, w);
}

template <bool kGateUp>
cudaError_t Launch(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  static const bool early = MoeDownEarly(), sub = EnvOn("MOESHARD_MOE_SUBNORMAL");
  if (kGateUp) return sub ? LaunchK<true, false, true>(p, w, stream) : LaunchK<true, false, false>(p, w, stream);
  if (early) return sub ? LaunchK<false, true, true>(p, w, stream) : LaunchK<false, true, false>(p, w, stream);
  return sub ? LaunchK<false, false, true>(p, w, stream) : LaunchK<false, false, false>(p, w, stream);
}

}  // namespace

cudaError_t LaunchMoeDirect(bool gate_up, const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return gate_up ? Launch<true>(p, w, stream) : Launch<false>(p, w, stream);
}

}  // namespace moeshard::gpu
