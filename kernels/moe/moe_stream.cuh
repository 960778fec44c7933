// The streaming kernels: expert weights repacked once at load (MoeRepackNvfp4, MoeRepackMxfp4,
// MoeRepackQ8), then streamed through shared memory by the bulk-copy engine while warps decode
// and multiply. This header holds the kernel templates; moe_nvfp4_stream.cu instantiates them
// for e2m1 codes (NVFP4, MXFP4) and moe_q8_stream.cu for int8 codes (Q8_0), each with its repack.
//
// Repacked layout (per matrix [rows, cols], dense; rows % 16 == 0, cols % 256 == 0). The
// matrix is cut into 16-row slices and 256-column chunks; chunk (s, kc) is 2048 contiguous
// bytes of codes at ((s · cols/256) + kc) · 2048 and 256 bytes of scales at the same index
// · 256. Inside a chunk, lane (g, c) = (lane/4, lane%4) of a warp owns, for each 64-column
// quad q, block c of the quad (16 columns) of rows g and g+8: four 32-bit words at byte
// (q · 32 + lane) · 16, in the order (row g, cols 0-7), (row g+8, cols 0-7), (row g, cols
// 8-15), (row g+8, cols 8-15). Each word holds the row's 8 consecutive codes with their
// bits shuffled (kRepackBit) so that the decode needs 6 logic instructions and 5 shifts
// written as multiplies (FMA pipe) per word, against 8 + 8 for the stored nibble order.
// Scales: lane (g, c) finds at byte lane · 8 the e4m3 scales of block c for (quad 0, row g),
// (quad 0, row g+8), (quad 1, row g), ... (quad 3, row g+8), sign bits cleared.
//
// mma k mapping. In k16 step u (0..3) of a quad, lane c's four k values (2c, 2c+1, 2c+8,
// 2c+9) are columns 4u .. 4u+3 of block c: the lane's B fragments for the whole quad are
// the 16 consecutive activations x[16c .. 16c+15] of the quad (two 16-byte loads, no
// permutation of x or h), and every A register's two halves share one block scale.
//
// Decode (bf16): slot j of a word (codes 2j, 2j+1) becomes one bf16x2 register holding
// e2m1 · 2^-126 (code bits at bf16 bits 6..8 and 15, as moe_device.cuh explains), times the
// block scale · 2^118 (one bf16x2 multiply) → e2m1 · scale · 2^-8; the epilogue multiplies
// by scale2 · 2^8.
//
// MXFP4 (MoeRepackMxfp4): the same codes (e2m1) in the same layout; the scales 128 bytes a
// chunk, one a 32-column block, the word that lanes c and c ^ 1 share at (g · 2 + c / 2) · 8
// (moe_stream_decode.h E2m1ScaleWord; 4.25 bits a weight, as stored). A scale byte is the
// block's e8m0 exponent s as the biased bf16 exponent of
// 2^(s-127) · 2^118, i.e. s + 118 (MoeWork::stream_mx: the consumers shift it into place
// instead of converting e4m3), and scale2 is 1. Exact for 3 ≤ s ≤ 136 (the scale times the
// smallest code stays a bf16 subnormal or above, the bf16 exponent below 255), which the
// repack checks first (MoeMxfp4Repackable): every real checkpoint's scales are far inside.
//
// Q8_0 (MoeRepackQ8, kQ8 below): int8 codes, 4096 bytes a slice and chunk, laid out by
// moe_q8_stream_layout.h so that each mma k16 step stays inside one 32-column block: lane (g, c)
// holds, for block b of the chunk, columns 32b + 8c .. 32b + 8c + 7 of rows g and g + 8 (16
// bytes), and reads the activations of the same 8 columns with one 16-byte load. Codes become
// bf16 exactly (I8x4ToBf16); each block's two k16 products go to a fresh accumulator that is
// added to the item's sums times the block's fp16 scale in fp32, as the GEMV kernels over the
// stored blocks do; the views' scale2 is 2^-8 so that the shared epilogue's 2^8 cancels.
//
// Pipeline. A block is CW consumer warps (4, or 8 above 512 tokens) and 1 producer warp;
// the ring holds 2 stages of 256 columns (3 blocks per SM with CW = 4, 2 with CW = 8; Q8_0's
// stages hold twice the code bytes: 2 and 1). The
// producer walks the block's pieces of work (Cursor, below) and, per chunk, fills a ring
// stage with cp.async.bulk copies (the slices' codes and scales, and one row of
// activations per token) completing on the stage's "full" mbarrier; consumers wait on it,
// compute, and release the stage through its "empty" mbarrier. The ring runs across item
// boundaries, so an item's start never drains the pipeline.
//
// Work items (expert, row block, 32-token tile), numbered expert by expert with the token
// tile fastest. A warp owns M 16-row slices: gate/up M = 2 is gate and up of the same 16
// rows (16 · CW rows per item); M = 1 (up to 4 tokens) puts gate and up in different warps
// that meet in shared memory (8 · CW rows per item). Down: M 16-row slices per warp
// (16 · M · CW rows per item).
//
// Schedule (persistent grid of G blocks): the full waves of whole items with a static
// stride (block b: items b, b + G, ...), then, with 4 consumer warps, the last partial
// wave cut in K (stream-K): its (item, chunk) units are split evenly into G contiguous
// ranges, so an item may be shared by a few blocks. Each writes its fp32 partial sums to a
// slot in the workspace and counts itself in; the last to arrive adds all the slots in
// block order and runs the epilogue (FixUp): the same sums in the same order whichever
// block comes last, so results repeat bit for bit run to run (they depend on the grid and
// the batch's routing, as the cut does). The down GEMM always cuts its tail; gate/up only
// when the tail has more items than there are SMs (a smaller tail runs one block per SM,
// alone and fast enough: cutting it measured slower).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/mbarrier.cuh"
#include "kernels/moe/moe_device.cuh"
#include "kernels/moe/moe_env.h"
#include "kernels/moe/moe_launch.h"
#include "kernels/moe/moe_q8_stream_layout.h"

namespace moeshard::gpu::moe_stream {

constexpr int kKc = 256;  // columns per stage
constexpr int kMaxStages = 8;
// Bytes of codes per slice and chunk: 2048 of e2m1 (NVFP4, MXFP4), 4096 of int8 (Q8_0).
template <bool kQ8>
__host__ __device__ constexpr int SliceData() {
  return kQ8 ? kQ8StreamSliceBytes : 16 * kKc / 2;
}
constexpr int kSliceScale = 16 * kKc / 16;  // 256 bytes of scales (e4m3 / e8m0 bytes, or Q8_0's fp16)
static_assert(kSliceScale == kQ8StreamSliceScaleBytes, "one scale stage size for every format");
constexpr int kQuads = kKc / 64;
// One token's activations, padded so that a warp's 16-byte loads hit distinct banks.
template <bool kQ8>
__host__ __device__ constexpr int BRow() {
  return kQ8 ? kQ8StreamBRow : kKc * 2 + 16;
}
// A block: CW consumer warps (4 or 8) and one producer warp.
__host__ __device__ constexpr int Threads(int cw) { return 32 * (cw + 1); }
// A stage holds the slices of CW warps × max(M, 2) (M = 1 items use half of them).
__host__ __device__ constexpr int Slices(int cw, int m) { return cw * (m < 2 ? 2 : m); }
template <bool kQ8>
__host__ __device__ constexpr int StageA(int cw, int m) {
  return Slices(cw, m) * SliceData<kQ8>();
}
__host__ __device__ constexpr int StageS(int cw, int m) { return Slices(cw, m) * kSliceScale; }
template <bool kQ8>
__host__ __device__ constexpr int StageBytes(int cw, int m) {
  return StageA<kQ8>(cw, m) + StageS(cw, m) + kMoeTileTokens * BRow<kQ8>();
}
constexpr int kXchgBytes = 2 * 4 * 4 * 32 * 4;  // M = 1 gate/up: two up warps' accumulators
constexpr int kFlagOffset = 2 * kMaxStages * 8 + kXchgBytes;
constexpr int kHeadBytes = kFlagOffset + 128;  // barriers, exchange, fix-up flag; then the ring
template <bool kQ8>
__host__ __device__ constexpr int SmemBytes(int cw, int m, int stages) {
  return kHeadBytes + stages * StageBytes<kQ8>(cw, m);
}

__device__ __forceinline__ uint4 Lds128(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }


// ---- work items --------------------------------------------------------------------------

struct Item {
  int e;
  int64_t rb;
  int ntok;
  int32_t row0;  // first grouped row of the tile
};

// Item `item` (numbered expert by expert; within an expert row block, then token tile
// fastest). `e` only moves forward: a block's items increase.
__device__ __forceinline__ void GetItem(const MoeWork& w, int64_t per_tile, int64_t item, int& e, Item& it) {
  while (static_cast<int64_t>(w.tile_base[e + 1]) * per_tile <= item) ++e;
  const int64_t local = item - static_cast<int64_t>(w.tile_base[e]) * per_tile;
  const int32_t begin = w.offsets[e], count = w.offsets[e + 1] - begin;
  const int tiles = (count + kMoeTileTokens - 1) / kMoeTileTokens;
  it.e = e;
  it.rb = local / tiles;
  const int tile = static_cast<int>(local % tiles);
  it.ntok = min(kMoeTileTokens, count - tile * kMoeTileTokens);
  it.row0 = begin + tile * kMoeTileTokens;
}

// Output rows per item.
template <bool kGateUp, int M, int CW>
__host__ __device__ constexpr int ItemRows() {
  return kGateUp ? 8 * M * CW : 16 * M * CW;
}

// Slice l (0 .. CW·M-1; consumer warp l / M, its slice l % M) of an item: matrix and first
// row. Gate/up with even M: slices 2i and 2i+1 are gate and up of the same 16 rows.
template <bool kGateUp, int M, int CW>
__device__ __forceinline__ const WeightRef& SliceOf(const MoeExpertWeights& ew, int64_t rb, int l, int64_t& row) {
  if constexpr (kGateUp) {
    if constexpr (M % 2 == 0) {
      row = rb * ItemRows<true, M, CW>() + 16 * (l >> 1);
      return (l & 1) ? ew.up : ew.gate;
    } else {
      row = rb * ItemRows<true, M, CW>() + 16 * (l % (CW / 2));
      return l >= CW / 2 ? ew.up : ew.gate;
    }
  } else {
    row = rb * ItemRows<false, M, CW>() + 16 * l;
    return ew.down;
  }
}

// ---- consumers ---------------------------------------------------------------------------

// One 256-column stage of e2m1 codes: M slices × NT n8 tiles.
template <int M, int NT, int CW>
__device__ __forceinline__ void ComputeStageE2m1(const uint8_t* sb, int warp, int lane, bool mx,
                                                 float (&acc)[NT][M][4]) {
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int q = 0; q < kQuads; ++q) {
    uint4 wd[M];
    uint32_t s2[M][2];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int l = warp * M + m;
      wd[m] = Lds128(sb + l * SliceData<false>() + (q * 32 + lane) * 16);
      const uint32_t sc =
          *reinterpret_cast<const uint32_t*>(sb + StageA<false>(CW, M) + l * kSliceScale + E2m1ScaleWord(lane, q, mx));
      E2m1ScalePair(sc, q, mx, s2[m]);
    }
    uint4 bq[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint8_t* bp = sb + StageA<false>(CW, M) + StageS(CW, M) + (nt * 8 + g) * BRow<false>() + q * 128 + c * 32;
      bq[nt][0] = Lds128(bp);
      bq[nt][1] = Lds128(bp + 16);
    }
#pragma unroll
    for (int jw = 0; jw < 2; ++jw) {
      uint32_t ag[M][4], ag8[M][4];
#pragma unroll
      for (int m = 0; m < M; ++m) {
        DecodeRepacked(jw == 0 ? wd[m].x : wd[m].z, s2[m][0], ag[m]);
        DecodeRepacked(jw == 0 ? wd[m].y : wd[m].w, s2[m][1], ag8[m]);
      }
#pragma unroll
      for (int uu = 0; uu < 2; ++uu) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint4 b = bq[nt][jw];
          const uint32_t b0 = uu == 0 ? b.x : b.z, b1 = uu == 0 ? b.y : b.w;
#pragma unroll
          for (int m = 0; m < M; ++m) {
            MmaBf16(acc[nt][m], ag[m][2 * uu], ag8[m][2 * uu], ag[m][2 * uu + 1], ag8[m][2 * uu + 1], b0, b1);
          }
        }
      }
    }
  }
}

// One 256-column stage of int8 codes (Q8_0, moe_q8_stream_layout.h): per 32-column block, two
// k16 steps into a fresh accumulator, added to the sums times the block's scale (rows g, g + 8).
template <int M, int NT, int CW>
__device__ __forceinline__ void ComputeStageQ8(const uint8_t* sb, int warp, int lane, float (&acc)[NT][M][4]) {
  const int g = lane >> 2;
  const uint8_t* scales = sb + StageA<true>(CW, M);
  const uint8_t* brow = sb + StageA<true>(CW, M) + StageS(CW, M) + g * BRow<true>();
// A quad at a time: fully unrolled, the hoisted loads spill at ptxas's cap of 168 registers.
#pragma unroll 2
  for (int b = 0; b < kQ8StreamCols / 32; ++b) {
    uint32_t a[M][2][4];  // [slice][step][a0..a3]
    float d[M][2];        // [slice][row g, g + 8]: block b's scales
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const uint4 v = Lds128(sb + (warp * M + m) * SliceData<true>() + Q8StreamLaneCodes(b, lane));
      Q8LaneFragments(v.x, v.y, v.z, v.w, a[m]);
      const uint32_t sc = *reinterpret_cast<const uint32_t*>(scales + (warp * M + m) * kSliceScale +
                                                             Q8StreamLaneScales(b / 2, lane) + 4 * (b % 2));
      F16x2ToF32(sc, d[m][0], d[m][1]);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint4 x = Lds128(brow + nt * 8 * BRow<true>() + Q8StreamLaneB(b, lane));
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float part[4];
        MmaBf16Zero(part, a[m][0][0], a[m][0][1], a[m][0][2], a[m][0][3], x.x, x.y);
        MmaBf16(part, a[m][1][0], a[m][1][1], a[m][1][2], a[m][1][3], x.z, x.w);
        acc[nt][m][0] = fmaf(part[0], d[m][0], acc[nt][m][0]);
        acc[nt][m][1] = fmaf(part[1], d[m][0], acc[nt][m][1]);
        acc[nt][m][2] = fmaf(part[2], d[m][1], acc[nt][m][2]);
        acc[nt][m][3] = fmaf(part[3], d[m][1], acc[nt][m][3]);
      }
    }
  }
}

template <int M, int NT, int CW, bool kQ8>
__device__ __forceinline__ void ComputeStage(const uint8_t* sb, int warp, int lane, bool mx, float (&acc)[NT][M][4]) {
  if constexpr (kQ8) {
    ComputeStageQ8<M, NT, CW>(sb, warp, lane, acc);
  } else {
    ComputeStageE2m1<M, NT, CW>(sb, warp, lane, mx, acc);
  }
}

struct Ring {
  uint8_t* stages;
  uint64_t* full;
  uint64_t* empty;
  int n;
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void Advance() {
    if (++stage == n) stage = 0, phase ^= 1;
  }
};

// A block's pieces: whole items b, b + G, ... below `full` (the full waves, strided so that
// the blocks running together share experts), then its units [u, uend) of the tail's
// (item, chunk) sequence, cut evenly over the blocks (stream-K).
// Only the 4-warp kernels cut the tail (the 8-warp ones, above 512 tokens, have many waves,
// and the cursor's registers would spill there: they sit at 96).
template <int CW>
constexpr bool kStreamK = CW == 4;

struct Cursor {
  int next, full, G;  // strided whole items
  int u, uend, U;     // tail units
  template <bool kSplit>
  __device__ __forceinline__ bool Next(int chunks, int& item, int& kc0, int& kc1) {
    if (next < full) {
      item = next, kc0 = 0, kc1 = chunks;
      next += G;
      return true;
    }
    if (!kSplit || u >= uend) return false;
    const int t = u / chunks;
    item = full + t;
    kc0 = u - t * chunks;
    kc1 = kc0 + (uend - u) < chunks ? kc0 + (uend - u) : chunks;
    u += kc1 - kc0;
    return true;
  }
};

// Stream-K: a block's units (item, chunk) are one contiguous range, so an item may be cut
// between blocks first .. first + nparts - 1. Each writes its partial sums to its slot (0 for
// the block's first piece, 1 for its last) and counts itself in; the last to arrive adds
// all the slots in block order (the same sum whoever arrives last: bit-exact run to run)
// and runs the epilogue.
struct Fix {
  int u0;  // the item's first unit
  int U;   // units per block
  int first, nparts;
};

template <int NT, int M, int CW>
__device__ __forceinline__ bool FixUp(const MoeWork& w, const Fix& fx, int* flag, int warp, int lane,
                                      float (&acc)[NT][M][4]) {
  constexpr int kPer = NT * M * 4 * 32;  // floats per warp
  auto slot = [&](int j) {
    return w.fix_part + (int64_t{j} * 2 + (fx.u0 < j * fx.U ? 0 : 1)) * kMoeFixSlotFloats + warp * kPer;
  };
  float* mine = slot(blockIdx.x);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int q = 0; q < 4; ++q) __stcg(mine + ((nt * M + m) * 4 + q) * 32 + lane, acc[nt][m][q]);
  __threadfence();
  asm volatile("bar.sync 2, %0;" ::"n"(32 * CW) : "memory");
  if (warp == 0 && lane == 0) {
    const uint32_t old = atomicAdd(&w.fix_count[fx.first], 1u);
    const int last = old == static_cast<uint32_t>(fx.nparts - 1);
    if (last) w.fix_count[fx.first] = 0;  // ready for the next launch
    *reinterpret_cast<volatile int*>(flag) = last;
  }
  asm volatile("bar.sync 2, %0;" ::"n"(32 * CW) : "memory");
  if (!*reinterpret_cast<volatile int*>(flag)) return false;
  __threadfence();
  // Every part from the slots (this block's own too), in block order.
#pragma unroll 1
  for (int j = fx.first; j < fx.first + fx.nparts; ++j) {
    const float* src = slot(j);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float v = __ldcg(src + ((nt * M + m) * 4 + q) * 32 + lane);
          acc[nt][m][q] = j == fx.first ? v : acc[nt][m][q] + v;
        }
  }
  return true;
}

template <bool kGateUp, int M, int NT, int CW, bool kQ8>
__device__ __forceinline__ void ConsumeItem(const MoeExpertParams& p, const MoeWork& w, const Item& it, int item,
                                            int kc0, int kc1, int chunks, const Cursor& cur, Ring& ring, float* xchg,
                                            int* flag, int warp, int lane, int probe) {
  float acc[NT][M][4];
  ZeroAcc<M, NT>(acc);
#pragma unroll 1
  for (int kc = kc0; kc < kc1; ++kc) {
    MbarrierWait(&ring.full[ring.stage], ring.phase);
    if (probe != 2) {
      ComputeStage<M, NT, CW, kQ8>(ring.stages + ring.stage * StageBytes<kQ8>(CW, M), warp, lane, w.stream_mx, acc);
    }
    __syncwarp();
    if (lane == 0) MbarrierArrive(&ring.empty[ring.stage]);
    ring.Advance();
  }
  if constexpr (kStreamK<CW>) {
    if (kc1 - kc0 < chunks) {  // a piece of a tail item
      Fix fx;
      fx.u0 = (item - cur.full) * chunks;  // in the tail's units
      fx.U = cur.U;
      fx.first = fx.u0 / fx.U;
      fx.nparts = (fx.u0 + chunks - 1) / fx.U - fx.first + 1;
      if (fx.nparts > 1 && !FixUp<NT, M, CW>(w, fx, flag, warp, lane, acc)) return;
    }
  }
  const int g = lane >> 2, c = lane & 3;
  const MoeExpertWeights& ew = p.experts[it.e];
  if constexpr (kGateUp) {
    const float sg = ew.gate.scale2 * 256.f, su = ew.up.scale2 * 256.f;
    uint16_t* h = static_cast<uint16_t*>(w.h);
    if constexpr (M % 2 == 0) {
#pragma unroll
      for (int mp = 0; mp < M / 2; ++mp) {
        const int64_t i0 = it.rb * ItemRows<true, M, CW>() + 16 * (warp * (M / 2) + mp);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int tok = nt * 8 + 2 * c + (q & 1);
            if (tok >= it.ntok) continue;
            const int64_t i = i0 + g + ((q & 2) ? 8 : 0);
            const float gv = RoundBf16(acc[nt][2 * mp][q] * sg), uv = RoundBf16(acc[nt][2 * mp + 1][q] * su);
            h[(it.row0 + tok) * p.inter + i] = DevF32ToBf16(Silu(gv) * uv);
          }
      }
    } else {
      int64_t i0;
      float up[NT][4];
      static_assert(CW == 4, "M = 1 exchanges through two warps' worth of shared memory");
      i0 = it.rb * ItemRows<true, M, CW>() + 16 * (warp % (CW / 2));
      float* xw = xchg + (warp % (CW / 2)) * (4 * 4 * 32);
      if (warp >= CW / 2) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int q = 0; q < 4; ++q) xw[(nt * 4 + q) * 32 + lane] = acc[nt][0][q];
      }
      asm volatile("bar.sync 1, %0;" ::"n"(32 * CW) : "memory");
      if (warp < CW / 2) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int q = 0; q < 4; ++q) up[nt][q] = xw[(nt * 4 + q) * 32 + lane];
      }
      asm volatile("bar.sync 1, %0;" ::"n"(32 * CW) : "memory");
      if (warp >= CW / 2) return;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int tok = nt * 8 + 2 * c + (q & 1);
          if (tok >= it.ntok) continue;
          const int64_t i = i0 + g + ((q & 2) ? 8 : 0);
          const float gv = RoundBf16(acc[nt][0][q] * sg), uv = RoundBf16(up[nt][q] * su);
          h[(it.row0 + tok) * p.inter + i] = DevF32ToBf16(Silu(gv) * uv);
        }
    }
  } else {
    const float sd = ew.down.scale2 * 256.f;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int64_t i0 = it.rb * ItemRows<false, M, CW>() + 16 * (warp * M + m);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int tok = nt * 8 + 2 * c + (q & 1);
          if (tok >= it.ntok) continue;
          const int64_t i = i0 + g + ((q & 2) ? 8 : 0);
          w.y[(it.row0 + tok) * p.width + i] = acc[nt][m][q] * sd;
        }
    }
  }
}

// Blocks per SM that shared memory allows (2 ring stages): the register budget follows.
template <int CW, bool kQ8>
constexpr int kMinBlocks = kQ8 ? (CW == 4 ? 2 : 1) : (CW == 4 ? 3 : 2);

template <bool kGateUp, int M, int CW, bool kQ8>
__global__ void __launch_bounds__(Threads(CW), kMinBlocks<CW, kQ8>)
    StreamKernel(MoeExpertParams p, MoeWork w, int stages, int probe, int split_mode, int min_tail) {
  extern __shared__ __align__(128) uint8_t smem[];
  Ring ring;
  ring.n = stages;
  ring.full = reinterpret_cast<uint64_t*>(smem);
  ring.empty = ring.full + kMaxStages;
  float* xchg = reinterpret_cast<float*>(smem + 2 * kMaxStages * 8);
  int* flag = reinterpret_cast<int*>(smem + kFlagOffset);
  ring.stages = smem + kHeadBytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      MbarrierInit(&ring.full[s], 1);
      MbarrierInit(&ring.empty[s], CW);
    }
    FenceMbarrierInit();
  }
  __syncthreads();
  const int E = p.num_local_experts;
  const int64_t K = kGateUp ? p.width : p.inter;
  const int64_t N = kGateUp ? p.inter : p.width;
  const int64_t per_tile = N / ItemRows<kGateUp, M, CW>();
  const int64_t total = static_cast<int64_t>(w.tile_base[E]) * per_tile;
  const int chunks = static_cast<int>(K / kKc);
  // Whole items in full waves; the last partial wave's items (when more than min_tail,
  // or split_mode 2; never with split_mode 0) cut in K over all the blocks, so every block
  // gets the same work. Units fit in 32 bits (LaunchStream checks).
  Cursor cur;
  cur.G = gridDim.x;
  cur.next = blockIdx.x;
  cur.full = static_cast<int>(total) / cur.G * cur.G;
  if (!kStreamK<CW> || split_mode == 0 || (split_mode == 1 && static_cast<int>(total) - cur.full <= min_tail)) {
    cur.full = static_cast<int>(total);
  }
  if (probe == 3 && blockIdx.x == 0 && threadIdx.x == 0) {  // MOESHARD_MOE_PROBE=3: the split decision
    printf("stream kernel gate_up=%d M=%d CW=%d: items %d, grid %d, whole %d, split_mode %d, min_tail %d\n",
           int(kGateUp), M, CW, static_cast<int>(total), cur.G, cur.full, split_mode, min_tail);
  }
  const int tail_units = (static_cast<int>(total) - cur.full) * chunks;
  cur.U = (tail_units + cur.G - 1) / cur.G;
  if (cur.U < 1) cur.U = 1;
  cur.u = blockIdx.x * cur.U;
  cur.uend = cur.u + cur.U < tail_units ? cur.u + cur.U : tail_units;
  int e = 0;
  int item, kc0, kc1;
  if (warp == CW) {  // producer
    while (cur.Next<kStreamK<CW>>(chunks, item, kc0, kc1)) {
      Item it;
      GetItem(w, per_tile, item, e, it);
      const MoeExpertWeights& ew = p.experts[it.e];
      const uint8_t *dsrc = nullptr, *ssrc = nullptr, *bsrc = nullptr;
      // A slice's scale bytes a chunk: Q8_0's fp16, NVFP4's e4m3 a 16 columns, MXFP4's e8m0 a 32.
      const uint32_t sbytes = kQ8 ? kSliceScale : E2m1ScaleBytes(w.stream_mx);
      if (lane < CW * M) {
        int64_t row;
        const WeightRef& wr = SliceOf<kGateUp, M, CW>(ew, it.rb, lane, row);
        const int64_t idx = (row / 16) * (wr.cols / kKc);
        dsrc = wr.data + idx * SliceData<kQ8>();
        ssrc = wr.scale + idx * sbytes;
      }
      if (lane < it.ntok) {
        const int32_t r = it.row0 + lane;
        bsrc = kGateUp ? reinterpret_cast<const uint8_t*>(static_cast<const uint16_t*>(p.x) +
                                                          static_cast<int64_t>(w.rows[r] / p.top_k) * p.width)
                       : reinterpret_cast<const uint8_t*>(static_cast<const uint16_t*>(w.h) + int64_t{r} * p.inter);
      }
      const uint32_t bytes = CW * M * (SliceData<kQ8>() + sbytes) + it.ntok * kKc * 2;
      for (int kc = kc0; kc < kc1; ++kc) {
        MbarrierWait(&ring.empty[ring.stage], ring.phase ^ 1);
        uint64_t* full = &ring.full[ring.stage];
        if (probe == 1) {  // benchmarks: the consumers alone, on stale data
          if (lane == 0) MbarrierArrive(full);
          ring.Advance();
          continue;
        }
        if (lane == 0) MbarrierArriveExpectTx(full, bytes);
        __syncwarp();
        uint8_t* sb = ring.stages + ring.stage * StageBytes<kQ8>(CW, M);
        if (dsrc) {
          BulkCopyToShared(sb + lane * SliceData<kQ8>(), dsrc + int64_t{kc} * SliceData<kQ8>(), SliceData<kQ8>(), full);
          BulkCopyToShared(sb + StageA<kQ8>(CW, M) + lane * kSliceScale, ssrc + int64_t{kc} * sbytes, sbytes, full);
        }
        if (bsrc) {
          BulkCopyToShared(sb + StageA<kQ8>(CW, M) + StageS(CW, M) + lane * BRow<kQ8>(), bsrc + int64_t{kc} * kKc * 2,
                           kKc * 2, full);
        }
        ring.Advance();
      }
    }
    return;
  }
  while (cur.Next<kStreamK<CW>>(chunks, item, kc0, kc1)) {
    Item it;
    GetItem(w, per_tile, item, e, it);
    switch ((it.ntok + 7) / 8) {
      case 1:
        ConsumeItem<kGateUp, M, 1, CW, kQ8>(p, w, it, item, kc0, kc1, chunks, cur, ring, xchg, flag, warp, lane, probe);
        break;
      case 2:
        ConsumeItem<kGateUp, M, 2, CW, kQ8>(p, w, it, item, kc0, kc1, chunks, cur, ring, xchg, flag, warp, lane, probe);
        break;
      case 3:
        ConsumeItem<kGateUp, M, 3, CW, kQ8>(p, w, it, item, kc0, kc1, chunks, cur, ring, xchg, flag, warp, lane, probe);
        break;
      default:
        ConsumeItem<kGateUp, M, 4, CW, kQ8>(p, w, it, item, kc0, kc1, chunks, cur, ring, xchg, flag, warp, lane, probe);
        break;
    }
  }
}

// Ring depth: 2 stages of 256 columns (75 KB with 4 consumer warps) let 3 blocks share an
// SM (12 consumer warps). MOESHARD_MOE_STAGES overrides (benchmarks).
inline int RingStages() {
  static const int n = std::min(std::max(EnvInt("MOESHARD_MOE_STAGES", 2), 2), kMaxStages);
  return n;
}

// MOESHARD_MOE_PROBE (benchmarks only; wrong results): 1 = no loads (the consumers
// alone, on stale shared memory), 2 = no math (the copy pipeline alone); 3 (results
// right) prints each launch's work split from block 0. Shows which side
// of the pipeline bounds a size (PERF_NOTES.md).
inline int Probe() {
  static const int v = EnvInt("MOESHARD_MOE_PROBE", 0);
  return v;
}

// Cutting the last partial wave in K (stream-K): the down GEMM always, gate/up when the
// tail has more items than there are SMs (fewer run one block per SM alone, fast enough;
// measured: gate/up at T = 64 and 256 lost 4-5 % to the fix-ups, down gained 3-15 %).
// MOESHARD_MOE_STREAMK (benchmarks): 0 never, 2 always.
inline int SplitMode() {
  static const int v = EnvInt("MOESHARD_MOE_STREAMK", 1);
  return v;
}

template <bool kGateUp, int M, int CW, bool kQ8>
cudaError_t LaunchStream(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  // Q8_0's stages are larger: as many as fit in an SM's 227 KB of shared memory (2 always do).
  int stages = RingStages();
  while (stages > 2 && SmemBytes<kQ8>(CW, M, stages) > 227 * 1024) --stages;
  static const int blocks_per_sm = [stages] {
    if (cudaFuncSetAttribute(StreamKernel<kGateUp, M, CW, kQ8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             SmemBytes<kQ8>(CW, M, stages)) != cudaSuccess) {
      return 0;
    }
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, StreamKernel<kGateUp, M, CW, kQ8>, Threads(CW),
                                                      SmemBytes<kQ8>(CW, M, stages)) != cudaSuccess) {
      return 0;
    }
    if (EnvInt("MOESHARD_MOE_VERBOSE", 0)) {  // benchmarks: the occupancy each kernel got
      cudaFuncAttributes fa{};
      cudaFuncGetAttributes(&fa, StreamKernel<kGateUp, M, CW, kQ8>);
      std::fprintf(stderr,
                   "stream kernel gate_up=%d M=%d CW=%d q8=%d: %d blocks per SM, %d registers, %zu bytes local\n",
                   int(kGateUp), M, CW, int(kQ8), n, fa.numRegs, fa.localSizeBytes);
    }
    return std::max(n, 1);
  }();
  if (blocks_per_sm == 0) return cudaErrorInvalidConfiguration;
  const int64_t N = kGateUp ? p.inter : p.width;
  const int64_t K = kGateUp ? p.width : p.inter;
  const int64_t pairs = p.num_tokens * p.top_k;
  const int64_t max_tiles = std::min<int64_t>(p.num_local_experts, pairs) + pairs / kMoeTileTokens;
  const int64_t units = max_tiles * (N / ItemRows<kGateUp, M, CW>()) * (K / kKc);
  if (units > int64_t{1} << 30) return cudaErrorInvalidValue;  // the kernel counts units in 32 bits
  const int64_t grid =
      std::max<int64_t>(1, std::min<int64_t>({units, int64_t{blocks_per_sm} * w.num_sms, int64_t{kMoeFixBlocks}}));
  StreamKernel<kGateUp, M, CW, kQ8>
      <<<static_cast<unsigned>(grid), Threads(CW), SmemBytes<kQ8>(CW, M, stages), stream>>>(
          p, w, stages, Probe(), SplitMode(), kGateUp ? w.num_sms : 0);
  return cudaGetLastError();
}

// Item shapes by tokens (MOESHARD_MOE_SMALL_T and _LARGE_T override, benchmarks): up to 4
// tokens M = 1 (gate and up in different warps, half the rows per item); above 512 tokens
// 8 consumer warps per block, twice the rows per item, so each token's activations are
// read from L2 half as often per weight byte.
inline bool SmallItems(const MoeExpertParams& p) {
  static const int t = EnvInt("MOESHARD_MOE_SMALL_T", 4);
  return p.num_tokens <= t;
}
inline bool LargeItems(const MoeExpertParams& p) {
  static const int t = EnvInt("MOESHARD_MOE_LARGE_T", 512);
  return p.num_tokens > t;
}

// The kernels for these items, by batch size.
template <bool kQ8>
cudaError_t LaunchStreamGateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  if (SmallItems(p)) return LaunchStream<true, 1, 4, kQ8>(p, w, stream);
  if (LargeItems(p)) return LaunchStream<true, 2, 8, kQ8>(p, w, stream);
  return LaunchStream<true, 2, 4, kQ8>(p, w, stream);
}

template <bool kQ8>
cudaError_t LaunchStreamDown(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  if (SmallItems(p)) return LaunchStream<false, 1, 4, kQ8>(p, w, stream);
  if (LargeItems(p)) return LaunchStream<false, 2, 8, kQ8>(p, w, stream);
  return LaunchStream<false, 2, 4, kQ8>(p, w, stream);
}

}  // namespace moeshard::gpu::moe_stream
