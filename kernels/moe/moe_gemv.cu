// The GEMV/mma path: Q8_0, MXFP4 and BF16 experts with bf16 activations (moe_params.h
// MoeGemvEligible). Decode (≤ 8 tokens per expert) streams each touched expert's rows once;
// prefill reuses each decoded weight for up to 32 tokens on the tensor cores. Two kernels per
// GEMM (Cfg below): small tasks (≤ 8 tokens) and large ones (9-32), each skipping the other's;
// up to 512 pairs the small one takes every task (larger groups in passes of 8) and the large
// one is not launched.
//
// Tasks. (expert, row tile, group of ≤ 32 of its tokens), numbered expert by expert from the
// prefix that the route kernel wrote (w.gemv_base), the token group fastest so that blocks
// running together share weights in L2. A row tile is 16 rows of gate and the same 16 rows of
// up (gate/up), or 32 rows of down. One block of 4 warps per task: the warps split K into
// four ranges (split K, so that 1-token decode of 8 experts still gives ~400-500 blocks) and
// meet in shared memory at the end, where the sums run in a fixed order (deterministic).
//
// Weights. Each warp stages its 32 rows' bytes for a chunk of K (272 bytes of each row: 8
// Q8_0 blocks, 16 MXFP4 blocks or 128 BF16 columns) into shared memory with 16-byte cp.async,
// two chunks deep, aligned down to 16 bytes (so any row stride or base alignment works for
// the block formats; the odd 34- and 17-byte blocks are read back with funnel shifts). Lane
// (g, c) = (lane/4, lane%4) then decodes rows g and g+8 of each 16-row slice: 8 of the 32
// columns of each 32-column block, which are its A-fragment share of the two m16n8k16 k-steps
// that the block spans (the k order inside a block is permuted; the activations are read in
// the same order, so the dot products are unchanged):
//   Q8_0 / BF16: lane c holds columns 8c..8c+7 in natural order: B is one 16-byte load.
//   MXFP4: byte j of the block holds columns j and j+16; lane c decodes bytes 4c..4c+3 (the
//     NVFP4 pair decode of moe_device.cuh, times 2^126 so that the bf16 holds the e2m1 value
//     exactly) and reads the activations (4c, 4c+2), (4c+1, 4c+3), then the same + 16.
// int8 → bf16 is exact (|q| ≤ 128); the block scales (f16 d, e8m0) multiply each block's fp32
// partial sums (two mma into a zeroed accumulator, then an FFMA per element), so the only
// rounding beyond fp32 is the activations' own bf16.
//
// Activations. B fragments come straight from global memory (x by token for gate/up, h by
// grouped row for down; both stay in L1/L2): every weight fragment is reused for all the
// task's tokens (1, 2 or 4 n8 tiles).
//
// Epilogues as the other paths: h = bf16(silu(bf16(g)) · bf16(u)) (natural column order, these
// experts' rows of h are read by this path only), y rows fp32.
#include <algorithm>
#include <cstdlib>

#include "kernels/cuda/pdl.cuh"
#include "kernels/moe/moe_device.cuh"
#include "kernels/moe/moe_env.h"
#include "kernels/moe/moe_launch.h"

namespace moeshard::gpu {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 32;  // rows a warp stages: two 16-row slices

// Two kernels per GEMM, one per task class, each with its own register and shared-memory
// budget: small tasks (≤ 8 tokens, one n8 tile: decode) stage 136 bytes of each row per
// chunk (41 KB per block, 5 blocks per SM); large tasks (9-32 tokens) 272 bytes (74 KB, 3).
template <bool kSmall>
struct Cfg {
  static constexpr int kChunkBytes = kSmall ? 136 : 272;            // whole blocks of every format
  static constexpr int kSlot16 = (15 + kChunkBytes + 15) / 16;      // 16-byte copies per row
  static constexpr int kSlotBytes = 16 * kSlot16;                   // one row's chunk + alignment
  static constexpr int kStageBytes = kRows * kSlotBytes;            // one warp, one chunk
  static constexpr int kSmemBytes = 2 * kWarps * kStageBytes + 16;  // reads may run ≤ 16 bytes past a slot
  static constexpr int kMinBlocks = kSmall ? 5 : 3;
};

// A view reduced to what the staging needs: column 0 of row 0, and the row stride.
struct View {
  const uint8_t* base;
  int64_t stride;
};

template <WeightFormat F>
__device__ __forceinline__ View MakeView(const WeightRef& w) {
  const int64_t col_bytes = F == WeightFormat::kBF16 ? w.col_offset * 2 : w.col_offset / 32 * Fmt<F>::kBlockBytes;
  return View{w.data + col_bytes, w.row_stride_bytes};
}

// Address of 32-column block kb of row `row`.
template <WeightFormat F>
__device__ __forceinline__ const uint8_t* BlockPtr(const View& v, int64_t row, int64_t kb) {
  return v.base + row * v.stride + kb * Fmt<F>::kBlockBytes;
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void CpAsyncWaitOne() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
__device__ __forceinline__ void CpAsyncWaitAll() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// 4 bytes of shared memory at any byte address. The aligned word is formed by pointer
// arithmetic (not through an integer), so the compiler keeps the shared address space: ld.shared
// with 32-bit addresses, where a round trip through uintptr_t made generic 64-bit loads and their
// address arithmetic (ncu, 2026-12-04: 16 generic loads and ~40 address instructions of the
// decode loop's 353 a two-block step).
__device__ __forceinline__ uint32_t LdsU32(const uint8_t* p) {
  const uint32_t sh = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p) & 3);
  const uint32_t* a = reinterpret_cast<const uint32_t*>(p - sh);
  return __funnelshift_r(a[0], a[1], sh * 8);
}
// 8 bytes of shared memory at any byte address.
__device__ __forceinline__ void LdsU64(const uint8_t* p, uint32_t& lo, uint32_t& hi) {
  const uint32_t sh = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p) & 3);
  const uint32_t* a = reinterpret_cast<const uint32_t*>(p - sh);
  const uint32_t w0 = a[0], w1 = a[1], w2 = a[2];
  lo = __funnelshift_r(w0, w1, sh * 8);
  hi = __funnelshift_r(w1, w2, sh * 8);
}

// f16 bits → fp32 (exact for every finite value, subnormals too).
__device__ __forceinline__ float F16BitsToF32(uint32_t h) {
  float f;
  asm("{.reg .b16 t; cvt.u16.u32 t, %1; cvt.f32.f16 %0, t;}" : "=f"(f) : "r"(h));
  return f;
}

// One lane's A fragments of one 32-column block for rows g and g+8 of a slice:
// a[ks][0..3] = the mma's a0..a3 of k-step ks; sc[h] = the block scale of row g + 8h.
template <WeightFormat F>
__device__ __forceinline__ void DecodeBlock(const uint8_t* sg, const uint8_t* sg8, int c, uint32_t (&a)[2][4],
                                            float (&sc)[2]) {
  if constexpr (F == WeightFormat::kQ8_0) {
    const uint8_t* s[2] = {sg, sg8};
    uint32_t lo[2][2], hi[2][2];  // [row][k-step]
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sc[h] = F16BitsToF32(s[h][0] | (s[h][1] << 8));
      uint32_t q0, q1;
      LdsU64(s[h] + 2 + 8 * c, q0, q1);
      I8x4ToBf16(q0, lo[h][0], hi[h][0]);
      I8x4ToBf16(q1, lo[h][1], hi[h][1]);
    }
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      a[ks][0] = lo[0][ks], a[ks][1] = lo[1][ks], a[ks][2] = hi[0][ks], a[ks][3] = hi[1][ks];
    }
  } else if constexpr (F == WeightFormat::kMXFP4) {
    constexpr uint32_t k2p126 = 0x7E807E80u;
    uint32_t o[2][4];
    sc[0] = DevE8M0ToF32(sg[0]);
    sc[1] = DevE8M0ToF32(sg8[0]);
    DecodeNvfp4Word(LdsU32(sg + 1 + 4 * c), k2p126, o[0]);
    DecodeNvfp4Word(LdsU32(sg8 + 1 + 4 * c), k2p126, o[1]);
    // o[h][0] = columns (4c, 4c+2), [1] = (16+4c, 18+4c), [2] = (4c+1, 4c+3), [3] = (17+4c, 19+4c)
    a[0][0] = o[0][0], a[0][1] = o[1][0], a[0][2] = o[0][2], a[0][3] = o[1][2];
    a[1][0] = o[0][1], a[1][1] = o[1][1], a[1][2] = o[0][3], a[1][3] = o[1][3];
  } else {
    const uint4 wg = *reinterpret_cast<const uint4*>(sg + 16 * c);
    const uint4 wg8 = *reinterpret_cast<const uint4*>(sg8 + 16 * c);
    a[0][0] = wg.x, a[0][1] = wg8.x, a[0][2] = wg.y, a[0][3] = wg8.y;
    a[1][0] = wg.z, a[1][1] = wg8.z, a[1][2] = wg.w, a[1][3] = wg8.w;
    sc[0] = sc[1] = 1.f;
  }
}

// The B fragments of block kb for one n8 tile: b[ks][0..1].
template <WeightFormat F>
__device__ __forceinline__ void LoadB(const uint16_t* brow, int64_t kb, int c, uint32_t (&b)[2][2]) {
  if constexpr (F == WeightFormat::kMXFP4) {
    const uint2 v0 = __ldg(reinterpret_cast<const uint2*>(brow + 32 * kb + 4 * c));
    const uint2 v1 = __ldg(reinterpret_cast<const uint2*>(brow + 32 * kb + 16 + 4 * c));
    b[0][0] = __byte_perm(v0.x, v0.y, 0x5410), b[0][1] = __byte_perm(v0.x, v0.y, 0x7632);
    b[1][0] = __byte_perm(v1.x, v1.y, 0x5410), b[1][1] = __byte_perm(v1.x, v1.y, 0x7632);
  } else {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(brow + 32 * kb + 8 * c));
    b[0][0] = v.x, b[0][1] = v.y, b[1][0] = v.z, b[1][1] = v.w;
  }
}

// A task's two sums for grouped row `grow`, row r of its 16-row slices (first row i0): gate/up's
// h = bf16(silu(bf16(g)) · bf16(u)), down's two fp32 rows of y.
template <bool kGateUp>
__device__ __forceinline__ void StoreOut(const MoeExpertParams& p, const MoeWork& w, int64_t i0, int64_t grow,
                                         int64_t r, float s0, float s1) {
  if constexpr (kGateUp) {
    const float gv = RoundBf16(s0), uv = RoundBf16(s1);
    static_cast<uint16_t*>(w.h)[grow * p.inter + i0 + r] = DevF32ToBf16(Silu(gv) * uv);
  } else {
    w.y[grow * p.width + i0 + r] = s0;
    w.y[grow * p.width + i0 + 16 + r] = s1;
  }
}

// kLateWait: the caller has not waited for the kernel before (PdlWait); RunTask does, once the
// first chunk of weights is in flight and before it reads activations.
// kSplitK: the block's four warps split K over one row tile and meet in shared memory; else
// (row split) `rt` is this warp's own row tile, which it takes over the whole of K and stores
// itself (no block barrier: the caller's other warps run other row tiles).
template <WeightFormat F, bool kGateUp, bool kSmall, int NT, bool kDirect = false, bool kLateWait = false,
          bool kSplitK = true>
__device__ __forceinline__ void RunTask(const MoeExpertParams& p, const MoeWork& w, const MoeExpertWeights& ew,
                                        int64_t rt, int64_t row0, int ntok, uint8_t* smem) {
  using C = Cfg<kSmall>;
  constexpr int BB = Fmt<F>::kBlockBytes, KC = C::kChunkBytes / BB;
  constexpr int kSlot16 = C::kSlot16, kSlotBytes = C::kSlotBytes, kStageBytes = C::kStageBytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const View m0 = MakeView<F>(kGateUp ? ew.gate : ew.down);
  const View m1 = kGateUp ? MakeView<F>(ew.up) : m0;
  const int64_t i0 = rt * (kGateUp ? 16 : 32);
  const int64_t r0 = i0, r1 = kGateUp ? i0 : i0 + 16;  // first row of slice 0 and 1
  const int64_t K = kGateUp ? p.width : p.inter;
  const int nb = static_cast<int>(K / 32);
  const int kb_begin = kSplitK ? warp * nb / kWarps : 0, kb_end = kSplitK ? (warp + 1) * nb / kWarps : nb;
  const int nchunks = (kb_end - kb_begin + KC - 1) / KC;

  const uint16_t* brow[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int n = min(nt * 8 + g, ntok - 1);
    const int64_t pair = kDirect ? row0 : w.rows[row0 + n];  // direct: row0 is the pair, its one token's row
    brow[nt] = kGateUp ? static_cast<const uint16_t*>(p.x) + pair / p.top_k * p.width
                       : static_cast<const uint16_t*>(w.h) + (row0 + n) * p.inter;
  }
  float acc[NT][2][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[nt][m][q] = 0.f;

  uint8_t* wbuf = smem + warp * 2 * kStageBytes;
  auto stage = [&](int buf, int kb0) {
    const int nbytes = min(KC, kb_end - kb0) * BB;
#pragma unroll 2
    for (int i = lane; i < kRows * kSlot16; i += 32) {
      const int rr = i / kSlot16, ch = i - rr * kSlot16;
      const int64_t row = (rr < 16 ? r0 : r1) + (rr & 15);
      const uint8_t* src = BlockPtr<F>(View{rr < 16 ? m0.base : m1.base, rr < 16 ? m0.stride : m1.stride}, row, kb0);
      const uintptr_t off = reinterpret_cast<uintptr_t>(src) & 15;
      const int n16 = static_cast<int>((off + nbytes + 15) >> 4);
      if (ch < n16) {
        CpAsync16(wbuf + buf * kStageBytes + rr * kSlotBytes + ch * 16,
                  reinterpret_cast<const void*>((reinterpret_cast<uintptr_t>(src) & ~uintptr_t{15}) + 16 * ch));
      }
    }
    CpAsyncCommit();
  };

  if (nchunks > 0) stage(0, kb_begin);
  if constexpr (kLateWait) {
    PdlWait();
    PdlTrigger();
  }
#pragma unroll 1
  for (int ci = 0; ci < nchunks; ++ci) {
    const int kb0 = kb_begin + ci * KC;
    if (ci + 1 < nchunks) {
      stage((ci + 1) & 1, kb0 + KC);
    } else {
      CpAsyncCommit();  // an empty group keeps "all but the newest" meaning this chunk
    }
    CpAsyncWaitOne();
    __syncwarp();
    const uint8_t* sbuf = wbuf + (ci & 1) * kStageBytes;
    // Each lane's four rows (slice m, row g + 8h) in this chunk's slots.
    const uint8_t* srow[2][2];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rr = 16 * m + g + 8 * h;
        const uint8_t* src = BlockPtr<F>(m == 0 ? m0 : m1, (m == 0 ? r0 : r1) + g + 8 * h, kb0);
        srow[m][h] = sbuf + rr * kSlotBytes + (reinterpret_cast<uintptr_t>(src) & 15);
      }
    const int nkb = min(KC, kb_end - kb0);
#pragma unroll 2
    for (int b = 0; b < nkb; ++b) {
      const int64_t kb = kb0 + b;
      uint32_t bf[NT][2][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) LoadB<F>(brow[nt], kb, c, bf[nt]);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        uint32_t a[2][4];
        float sc[2];
        DecodeBlock<F>(srow[m][0] + b * BB, srow[m][1] + b * BB, c, a, sc);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if constexpr (F == WeightFormat::kBF16) {
            MmaBf16(acc[nt][m], a[0][0], a[0][1], a[0][2], a[0][3], bf[nt][0][0], bf[nt][0][1]);
            MmaBf16(acc[nt][m], a[1][0], a[1][1], a[1][2], a[1][3], bf[nt][1][0], bf[nt][1][1]);
          } else {
            float t[4];
            MmaBf16Zero(t, a[0][0], a[0][1], a[0][2], a[0][3], bf[nt][0][0], bf[nt][0][1]);
            MmaBf16(t, a[1][0], a[1][1], a[1][2], a[1][3], bf[nt][1][0], bf[nt][1][1]);
            acc[nt][m][0] = fmaf(sc[0], t[0], acc[nt][m][0]);
            acc[nt][m][1] = fmaf(sc[0], t[1], acc[nt][m][1]);
            acc[nt][m][2] = fmaf(sc[1], t[2], acc[nt][m][2]);
            acc[nt][m][3] = fmaf(sc[1], t[3], acc[nt][m][3]);
          }
        }
      }
    }
    __syncwarp();  // the next iteration's copy refills the other buffer; this one two on
  }
  CpAsyncWaitAll();
  if constexpr (!kSplitK) {
    __syncwarp();  // the lanes' reads of the staging buffer are done before a next pass refills it
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int tok = nt * 8 + 2 * c + (q & 1);
        if (tok >= ntok) continue;
        StoreOut<kGateUp>(p, w, i0, row0 + tok, g + ((q & 2) ? 8 : 0), acc[nt][0][q], acc[nt][1][q]);
      }
    return;
  }
  __syncthreads();  // every warp is done with its staging buffers

  // Split-K reduction: red[warp][nt][m][q][lane], summed in warp order.
  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int q = 0; q < 4; ++q) red[(((warp * NT + nt) * 2 + m) * 4 + q) * 32 + lane] = acc[nt][m][q];
  __syncthreads();
  const int q = warp;  // each warp finishes one accumulator element of every (tile, slice)
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int tok = nt * 8 + 2 * c + (q & 1);
    if (tok >= ntok) continue;
    float s[2];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      s[m] = 0.f;
#pragma unroll
      for (int wi = 0; wi < kWarps; ++wi) s[m] += red[(((wi * NT + nt) * 2 + m) * 4 + q) * 32 + lane];
    }
    StoreOut<kGateUp>(p, w, i0, row0 + tok, g + ((q & 2) ? 8 : 0), s[0], s[1]);
  }
}

template <WeightFormat F, bool kGateUp, bool kSmall, bool kSplitK = true>
__device__ __forceinline__ void RunTaskNt(const MoeExpertParams& p, const MoeWork& w, const MoeExpertWeights& ew,
                                          int64_t rt, int64_t row0, int ntok, uint8_t* smem) {
  if constexpr (kSmall) {
    RunTask<F, kGateUp, true, 1, false, false, kSplitK>(p, w, ew, rt, row0, ntok, smem);
  } else {
    if (ntok <= 16) {
      RunTask<F, kGateUp, false, 2>(p, w, ew, rt, row0, ntok, smem);
    } else {
      RunTask<F, kGateUp, false, 4>(p, w, ew, rt, row0, ntok, smem);
    }
  }
}

// all (small class only): this launch takes every task, a group of more than 8 tokens in passes
// of 8 — each token's sums the same as the large class's, whose n8 tiles are independent and
// run over the same K blocks in the same order.
// kRows (small class, all): a block's four warps take four row tiles of the task, each over the
// whole of K (RunTask's row split), instead of splitting one row tile's K: four times the chunks
// a warp and no block reduction, for steps with enough tasks to fill the GPU without the split.
template <bool kGateUp, bool kSmall, bool kRows = false>
__global__ void __launch_bounds__(kThreads, Cfg<kSmall>::kMinBlocks) GemvKernel(MoeExpertParams p, MoeWork w, int all) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int E = p.num_local_experts;
  const int64_t R0 = (kGateUp ? p.inter : p.width) / (kGateUp ? 16 : 32);  // row tiles per expert
  const int64_t R = kRows ? (R0 + kWarps - 1) / kWarps : R0;               // a block's row tiles per expert
  __shared__ int task_expert;
  PdlWait();
  PdlTrigger();
  const int64_t item = blockIdx.x;
  if (item >= static_cast<int64_t>(w.gemv_base[E]) * R) return;
  // The one expert whose task range holds `item`: all experts tested in parallel (one round
  // trip, where a binary search would take log2(E) dependent ones).
  for (int i = threadIdx.x; i < E; i += kThreads) {
    const int64_t b0 = static_cast<int64_t>(w.gemv_base[i]) * R, b1 = static_cast<int64_t>(w.gemv_base[i + 1]) * R;
    if (b0 <= item && item < b1) task_expert = i;
  }
  __syncthreads();
  const int e = task_expert;
  const int64_t local = item - static_cast<int64_t>(w.gemv_base[e]) * R;
  const int32_t begin = w.offsets[e], count = w.offsets[e + 1] - begin;
  const int groups = (count + kMoeGemvTokens - 1) / kMoeGemvTokens;
  const int64_t rt = kRows ? local / groups * kWarps + (threadIdx.x >> 5) : local / groups;
  const int tg = static_cast<int>(local % groups);
  if (kRows && rt >= R0) return;  // a warp past the expert's last row tile (no block barrier follows)
  const int ntok = min(kMoeGemvTokens, count - tg * kMoeGemvTokens);
  if (!all && (ntok <= 8) != kSmall) return;  // the other class's kernel takes it
  const int64_t row0 = begin + static_cast<int64_t>(tg) * kMoeGemvTokens;
  const MoeExpertWeights ew = p.experts[e];
  const auto run = [&](int64_t r0, int n) {
    switch (kGateUp ? ew.gate.format : ew.down.format) {
      case WeightFormat::kQ8_0:
        RunTaskNt<WeightFormat::kQ8_0, kGateUp, kSmall, !kRows>(p, w, ew, rt, r0, n, smem);
        break;
      case WeightFormat::kMXFP4:
        RunTaskNt<WeightFormat::kMXFP4, kGateUp, kSmall, !kRows>(p, w, ew, rt, r0, n, smem);
        break;
      case WeightFormat::kBF16:
        RunTaskNt<WeightFormat::kBF16, kGateUp, kSmall, !kRows>(p, w, ew, rt, r0, n, smem);
        break;
      default:
        break;  // the route kernel never marks another format
    }
  };
  if constexpr (kSmall) {
    for (int t0 = 0; t0 < ntok; t0 += 8) {
      if (t0 > 0 && !kRows) __syncthreads();  // the last pass's reduction is read before the staging reuses it
      run(row0 + t0, min(8, ntok - t0));
    }
  } else {
    run(row0, ntok);
  }
}

// Direct decode (MoeWork::direct): no route stage ran. Block i is (pair i / R, row tile i % R);
// the pair's expert comes from expert_ids (one read: the routing kernel's output), its one
// token's x row is pair / top_k, and its h and y rows are the pair index itself, so the
// gate/up kernel's row-tile-0 block writes pos[pair] (the pair, or -1: another GPU's expert)
// for the combine. Three dependent reads (gemv_base, offsets, rows) fewer before the weights.
//
// The down kernel reads expert_ids before it waits for the gate/up kernel (pdl.cuh's rule for
// memory written two launches back: the routing kernel completed before gate/up could let this
// grid start), so its first chunk of weights is in flight while gate/up finishes; the read
// goes to L2 (ld.global.cg), past any stale L1 line of an earlier layer's ids.
// kEarly (down only; MOESHARD_MOE_DOWN_EARLY=0 off): as above; else it waits first.
template <bool kGateUp, bool kEarly>
__global__ void __launch_bounds__(kThreads, Cfg<true>::kMinBlocks) GemvDirectKernel(MoeExpertParams p, MoeWork w) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr bool kLate = !kGateUp && kEarly;  // RunTask waits once its first weights are in flight
  int64_t pair, rt;
  const int e = DirectBlockStart<kGateUp, kLate>(p, w, (kGateUp ? p.inter : p.width) / (kGateUp ? 16 : 32), pair, rt);
  if (e < 0) return;
  const MoeExpertWeights ew = p.experts[e];
  switch (kGateUp ? ew.gate.format : ew.down.format) {
    case WeightFormat::kQ8_0:
      RunTask<WeightFormat::kQ8_0, kGateUp, true, 1, true, kLate>(p, w, ew, rt, pair, 1, smem);
      break;
    case WeightFormat::kMXFP4:
      RunTask<WeightFormat::kMXFP4, kGateUp, true, 1, true, kLate>(p, w, ew, rt, pair, 1, smem);
      break;
    case WeightFormat::kBF16:
      RunTask<WeightFormat::kBF16, kGateUp, true, 1, true, kLate>(p, w, ew, rt, pair, 1, smem);
      break;
    default:
      if constexpr (kLate) PdlWait();
      break;  // MoeExpertStepStages goes direct only when every expert takes this path
  }
}

template <bool kGateUp, bool kEarly>
cudaError_t LaunchDirectK(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  constexpr int kSmem = Cfg<true>::kSmemBytes;
  static const cudaError_t attr =
      cudaFuncSetAttribute(GemvDirectKernel<kGateUp, kEarly>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (attr != cudaSuccess) return attr;
  const int64_t R = (kGateUp ? p.inter : p.width) / (kGateUp ? 16 : 32);
  const int64_t grid = std::max<int64_t>(1, p.num_tokens * p.top_k * R);
  return LaunchPdl(GemvDirectKernel<kGateUp, kEarly>, static_cast<unsigned>(grid), kThreads, kSmem, stream, p, w);
}

template <bool kGateUp>
cudaError_t LaunchDirect(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  if (!kGateUp && MoeDownEarly()) return LaunchDirectK<kGateUp, true>(p, w, stream);
  return LaunchDirectK<kGateUp, false>(p, w, stream);
}

// MOESHARD_MOE_GEMV_SMALL_ALL: the most pairs at which the small class takes every task (512;
// 0: never).
int64_t SmallAllPairs() {
  static const int64_t n = [] {
    const char* v = std::getenv("MOESHARD_MOE_GEMV_SMALL_ALL");
    return v ? std::atoll(v) : int64_t{512};
  }();
  return n;
}

// MOESHARD_MOE_GEMV_ROWS: the fewest pairs at which the down GEMM's small-class blocks split rows
// instead of K (GemvKernel's kRows; default 65, past the direct kernels' 64; 0: never). Down only:
// its K (the expert width, 768 at the Qwen3-30B shape) gives each of four K-splitting warps less
// than one chunk; on the H200 (MXFP4, moe_expert_bench --stages) the row split took down from
// 61.7 to 54.2 us at T = 16 and 92.5 to 80.7 at T = 64, while gate/up (K = 2,048) went from
// 101.2 / 153.9 to 104.0 / 159.2 us, and with zipf routing at T = 16 from 71.3 to 85.9.
int64_t RowSplitPairs() {
  static const int64_t n = [] {
    const char* v = std::getenv("MOESHARD_MOE_GEMV_ROWS");
    return v ? std::atoll(v) : kMoeDirectMaxPairs + 1;
  }();
  return n;
}

template <bool kGateUp, bool kSmall, bool kRows = false>
cudaError_t LaunchClass(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream, int all = 0) {
  constexpr int kSmem = Cfg<kSmall>::kSmemBytes;
  static const cudaError_t attr =
      cudaFuncSetAttribute(GemvKernel<kGateUp, kSmall, kRows>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (attr != cudaSuccess) return attr;
  const int64_t R0 = (kGateUp ? p.inter : p.width) / (kGateUp ? 16 : 32);
  const int64_t R = kRows ? (R0 + kWarps - 1) / kWarps : R0;
  const int64_t pairs = p.num_tokens * p.top_k;
  const int64_t max_groups = std::min<int64_t>(p.num_local_experts, pairs) + pairs / kMoeGemvTokens;
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(max_groups * R, 0x7fffffff));
  return LaunchPdl(GemvKernel<kGateUp, kSmall, kRows>, static_cast<unsigned>(grid), kThreads, kSmem, stream, p, w, all);
}

template <bool kGateUp>
cudaError_t LaunchGemv(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  if (w.direct && w.direct_v2) return LaunchMoeDirect(kGateUp, p, w, stream);
  if (w.direct) return LaunchDirect<kGateUp>(p, w, stream);
  // Up to kMoeGemvSmallAllPairs pairs (1-8 tokens an expert on average) the small class takes
  // every task: the large class's launch would find few or no tasks, and its thousands of blocks
  // leaving one by one cost ~20 us a GEMM at 512 pairs (ncu, 2026-12-04).
  const int64_t pairs = p.num_tokens * p.top_k;
  const bool all = pairs <= SmallAllPairs();
  if constexpr (!kGateUp) {  // down only (RowSplitPairs); gate/up never instantiates the row split
    const int64_t rows_from = RowSplitPairs();
    if (all && rows_from > 0 && pairs >= rows_from) return LaunchClass<kGateUp, true, true>(p, w, stream, 1);
  }
  if (cudaError_t err = LaunchClass<kGateUp, true>(p, w, stream, all ? 1 : 0); err != cudaSuccess) return err;
  // Groups of more than 8 tokens exist only when some expert has more than 8 rows.
  if (!all && pairs > 8) return LaunchClass<kGateUp, false>(p, w, stream);
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchMoeGemvGateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return LaunchGemv<true>(p, w, stream);
}

cudaError_t LaunchMoeGemvDown(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return LaunchGemv<false>(p, w, stream);
}

}  // namespace moeshard::gpu
