// Device helpers shared by the MoE kernels: which experts the tensor-core path takes, the
// k-permutation of its bf16 operands, the NVFP4 nibble decode into bf16 pairs, and mma.
//
// NVFP4 → bf16 in registers. One 32-bit word holds 8 E2M1 codes e0..e7 (e0 in the low
// nibble). For p = 0..3 the pair (e_p, e_{p+4}) sits 16 bits apart, so one shift puts both
// codes' exponent-and-mantissa bits at bits 6..8 of their bf16 halves and another their
// signs at bit 15: the bf16 then holds e2m1 · 2^-126 (code 1, 0.5, is the subnormal 2^-127).
// One bf16x2 multiply by the block scale · 2^118 gives e2m1 · scale · 2^-8 exactly (at most
// 6 significant bits, well inside bf16's range); the accumulator is multiplied by
// scale2 · 2^8 at the end. The pairs come out as (e0,e4), (e1,e5), (e2,e6), (e3,e7); the
// activations are stored with each group of 8 columns in that order, so the mma sees the
// same (permuted) k for both operands and the dot products are unchanged (MoePermCol).
#pragma once

#include <cstdint>

#include "kernels/cuda/mma_bf16.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/weight_decode.cuh"
#include "kernels/moe/moe_launch.h"
#include "kernels/moe/moe_params.h"
#include "kernels/moe/moe_stream_decode.h"

namespace moeshard::gpu {

// Column col's position in the tensor-core path's permuted activation layout. Within each
// 128 columns, the 8-column group that lane c consumes at word j (columns 32c + 8j …) is
// stored as 16-byte chunk 4j + c, so the 4 lanes of a row read 64 contiguous bytes per
// word; within the group the columns are in pair order [0,4,1,5,2,6,3,7].
__host__ __device__ __forceinline__ int64_t MoePermCol(int64_t col) {
  const int64_t c = (col >> 5) & 3, j = (col >> 3) & 3, e = col & 7;
  return (col & ~int64_t{127}) | ((4 * j + c) << 3) | ((e & 3) << 1) | (e >> 2);
}

__device__ __forceinline__ bool FastEligible(const MoeExpertWeights& e, int64_t L, int64_t I) {
  return MoeNvfp4Eligible(e, L, I);
}

__device__ __forceinline__ float Silu(float g) { return g / (1.f + expf(-g)); }

// bf16 round trip (round to nearest even) of an fp32 value.
__device__ __forceinline__ float RoundBf16(float f) { return DevBf16ToF32(DevF32ToBf16(f)); }

using lane::MulBf16x2;  // kernels/cuda/lane_ops.h

// The two e4m3 block scales in the low bytes of `s16`, each · 2^118, as bf16 in both halves
// of out[0] and out[1]. Placing the 7 magnitude bits at bf16 bits 4..10 gives e4m3 · 2^-120
// for every finite code (subnormal ones too); two exact multiplies by 2^119 follow. A NaN
// scale (0x7f) reads as 480: no valid checkpoint holds one.
__device__ __forceinline__ void ScalePairBf16x2(uint32_t s16, uint32_t out[2]) {
  constexpr uint32_t k2p119 = 0x7B007B00u;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t b = __byte_perm(s16, 0, i == 0 ? 0x4040 : 0x4141);  // byte i in both halves
    const uint32_t tiny = ((b & 0x007F007Fu) << 4) | ((b & 0x00800080u) << 8);
    out[i] = MulBf16x2(MulBf16x2(tiny, k2p119), k2p119);
  }
}

// The 8 codes of `w` as 4 bf16 pairs (e0,e4), (e1,e5), (e2,e6), (e3,e7), times `s2`.
__device__ __forceinline__ void DecodeNvfp4Word(uint32_t w, uint32_t s2, uint32_t out[4]) {
  constexpr uint32_t kMag = 0x01C001C0u, kSign = 0x80008000u;
  out[0] = MulBf16x2(((w << 6) & kMag) | ((w << 12) & kSign), s2);
  out[1] = MulBf16x2(((w << 2) & kMag) | ((w << 8) & kSign), s2);
  out[2] = MulBf16x2(((w >> 2) & kMag) | ((w << 4) & kSign), s2);
  out[3] = MulBf16x2(((w >> 6) & kMag) | (w & kSign), s2);
}

// The direct kernels' split-K block reduction (moe_direct.cu, moe_stream_direct.cu): warp
// (slice, quarter) stores its four accumulators into `red` ([slice][quarter][element][lane]
// floats); after a block barrier, QuarterSum adds element q of slice m over the 4 quarters in
// order (the same sums whichever warp finishes first).
__device__ __forceinline__ void StoreQuarter(float* red, int slice, int quarter, int lane, const float (&acc)[4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) red[((slice * 4 + quarter) * 4 + q) * 32 + lane] = acc[q];
}
__device__ __forceinline__ float QuarterSum(const float* red, int m, int q, int lane) {
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) s += red[((m * 4 + k) * 4 + q) * 32 + lane];
  return s;
}

// Zeroes mma accumulators [token tiles][16-row slices][4].
template <int M, int NT>
__device__ __forceinline__ void ZeroAcc(float (&acc)[NT][M][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[nt][m][i] = 0.f;
}

// Bytes of one 32-column block of the GEMV/mma path's formats (moe_gemv.cu, moe_direct.cu).
template <WeightFormat F>
struct Fmt;
template <>
struct Fmt<WeightFormat::kQ8_0> {
  static constexpr int kBlockBytes = 34;
};
template <>
struct Fmt<WeightFormat::kMXFP4> {
  static constexpr int kBlockBytes = 17;
};
template <>
struct Fmt<WeightFormat::kBF16> {
  static constexpr int kBlockBytes = 64;
};

// The start of a direct-decode block (MoeWork::direct; block i = pair i / R, row tile i % R):
// the PDL wait unless kLate (the caller waits once its first weights are in flight), the pair's
// local expert (read through L2: the routing kernel's output), and for gate/up row tile 0 the
// pair's pos (the pair, or -1: another GPU's expert) for the combine. Returns the expert, or -1
// when the block has nothing to do (it has waited, as pdl.cuh asks of an early return).
template <bool kGateUp, bool kLate>
__device__ __forceinline__ int DirectBlockStart(const MoeExpertParams& p, const MoeWork& w, int64_t R, int64_t& pair,
                                                int64_t& rt) {
  if constexpr (!kLate) {
    PdlWait();
    PdlTrigger();
  }
  pair = blockIdx.x / R, rt = blockIdx.x % R;
  const int e = __ldcg(p.expert_ids + pair);
  if (kGateUp && rt == 0 && threadIdx.x == 0) w.pos[pair] = e >= 0 ? static_cast<int32_t>(pair) : -1;
  if (e < 0 && kLate) PdlWait();
  return e;
}

// The persistent wgmma GEMMs' tiles (moe_wgmma.cu, moe_stream_wgmma.cu): warp-wide, the number of
// `rows`-row tiles of every expert on path `path` as an exclusive prefix into base[E + 1] (shared
// memory), from the route's offsets and flags, both read through L2 (a kernel that reads them before
// its PDL wait — moe_stream_wgmma.cu's SwArgs::defer — must not see a line an earlier step left in L1).
__device__ __forceinline__ void MoeTilePrefix(const int32_t* offsets, const uint8_t* fast, int E, int path, int rows,
                                              int32_t* base, int lane) {
  int run = 0;
  for (int e0 = 0; e0 < E; e0 += 32) {
    const int e = e0 + lane;
    int v = 0;
    if (e < E && __ldcg(fast + e) == path) v = (__ldcg(offsets + e + 1) - __ldcg(offsets + e) + rows - 1) / rows;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int u = __shfl_up_sync(~0u, v, o);
      if (lane >= o) v += u;
    }
    if (e < E) base[e + 1] = run + v;
    run += __shfl_sync(~0u, v, 31);
  }
  if (lane == 0) base[0] = 0;
}

// Tile t's expert (the last e with base[e] <= t: experts without tiles are passed over) and its
// index within the expert, from MoeTilePrefix's prefix.
__device__ __forceinline__ void MoeTileOf(const int32_t* base, int E, int t, int& e, int& tile) {
  int lo = 0, hi = E - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (base[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  e = lo;
  tile = t - base[e];
}

}  // namespace moeshard::gpu
