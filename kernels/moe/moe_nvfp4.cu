// The tensor-core path: NVFP4 experts, bf16 activations, mma.sync m16n8k16 with the weights
// decoded from their stored nibbles straight into A fragments in registers (no expanded
// copy anywhere), so each weight byte is read from memory once per token tile.
//
// Layout. A warp owns one or two 16-row slices of the weights and up to 32 tokens (NT n8
// tiles). Lane (g, c) = (lane/4, lane%4) loads 16 bytes of rows g and g+8 at byte 16c of
// each 64-byte stretch of the row: 32 consecutive codes, two e4m3 scales. In physical k its
// codes are its share of 8 mma k-steps (moe_device.cuh: the pair decode, the permutation);
// the activations (xg, h) are stored permuted to match, so a B fragment pair is 16 bytes.
//
// Two kernels per GEMM, one per tile class, each with its own register budget:
//  - small tiles (≤ 16 tokens: decode sizes, memory-bound): a warp owns 16 rows of one
//    matrix, B comes from global memory (L1/L2), and the next 256 columns' bytes are not
//    prefetched: occupancy (96 registers, 20 warps per SM) hides the latency. For gate/up
//    the block's two warps take gate and up of the same rows and meet in shared memory.
//  - large tiles (17-32 tokens): a warp owns two 16-row slices (gate and up of the same
//    rows, or 32 rows of down), the block's B tile (32 tokens × 128 columns) is staged in
//    shared memory by cp.async two steps deep, and the weights of the next step are loaded
//    while the current ones are decoded.
//
// Work. Items (expert, row block, 32-token tile) are numbered expert by expert from the tile
// prefix that the route kernel wrote, the token tile fastest, so blocks that run together
// share weights in L2; a persistent grid strides over them and skips the other class's.
//
// Epilogues. Gate/up: h = bf16(silu(bf16(g)) · bf16(u)) stored permuted for the down GEMM.
// Down: y rows in fp32. Both multiply by scale2 · 2^8 (the decode's 2^-8).
#include <algorithm>

#include "kernels/moe/moe_device.cuh"
#include "kernels/moe/moe_launch.h"

namespace moeshard::gpu {
namespace {

constexpr int kWarps = 2;
constexpr int kThreads = 32 * kWarps;
// Large tiles' shared B: per stage 32 token rows of 128 columns (256 bytes) padded to 320
// bytes, which makes the 8 lanes of each LDS.128 phase hit distinct banks.
constexpr int kRowBytes = 320, kStageBytes = 32 * kRowBytes;

struct RowPair {  // rows g and g+8 of one 16-row slice: data and scale pointers at column 0
  const uint8_t* d[2];
  const uint8_t* s[2];
};

__device__ __forceinline__ RowPair MakeRowPair(const WeightRef& w, int64_t row0, int g) {
  RowPair r;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row0 + g + 8 * h;
    r.d[h] = w.data + row * w.row_stride_bytes + w.col_offset / 2;
    r.s[h] = w.scale + row * w.scale_row_stride + w.col_offset / 16;
  }
  return r;
}

// One lane's stored bytes for H · 128 columns of M 16-row slices.
template <int M, int H>
struct RawK {
  uint4 q[M][2][H];     // [slice][row g / g+8][128-column stretch]
  uint32_t s[M][2][H];  // the matching pairs of e4m3 scales
};

template <int M, int H>
__device__ __forceinline__ void LoadRaw(const RowPair (&a)[M], int64_t kb, int c, RawK<M, H>& r) {
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int st = 0; st < H; ++st) {
        const int64_t col = kb + 128 * st + 32 * c;
        r.q[m][h][st] = __ldg(reinterpret_cast<const uint4*>(a[m].d[h] + col / 2));
        r.s[m][h][st] = __ldg(reinterpret_cast<const uint16_t*>(a[m].s[h] + col / 16));
      }
}

// A fragments of word j of stretch st for every slice: a[m][row g / g+8][pair].
template <int M, int H>
__device__ __forceinline__ void DecodeWord(const RawK<M, H>& r, const uint32_t (&s2)[M][2][2], int st, int j,
                                           uint32_t (&a)[M][2][4]) {
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4 q = r.q[m][h][st];
      const uint32_t word = j == 0 ? q.x : j == 1 ? q.y : j == 2 ? q.z : q.w;
      DecodeNvfp4Word(word, s2[m][h][j >> 1], a[m][h]);
    }
}

template <int M, int H>
__device__ __forceinline__ void Scales(const RawK<M, H>& r, int st, uint32_t (&s2)[M][2][2]) {
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) ScalePairBf16x2(r.s[m][h][st], s2[m][h]);
}

// Two k-steps of every slice against one n8 tile: B = 16 bytes (two fragment pairs).
template <int M>
__device__ __forceinline__ void MmaPair(const uint32_t (&a)[M][2][4], uint4 b, float (&acc)[M][4]) {
#pragma unroll
  for (int m = 0; m < M; ++m) {
    MmaBf16(acc[m], a[m][0][0], a[m][1][0], a[m][0][1], a[m][1][1], b.x, b.y);
    MmaBf16(acc[m], a[m][0][2], a[m][1][2], a[m][0][3], a[m][1][3], b.z, b.w);
  }
}

// Small tiles: one slice × (up to 8·NT tokens), B from global memory, 256 columns a step.
template <int NT>
__device__ __forceinline__ void SmallWarpTile(const RowPair (&a)[1], const uint16_t* b, int64_t K, int ntok, int lane,
                                              float (&acc)[NT][1][4]) {
  const int g = lane >> 2, c = lane & 3;
  const uint16_t* brow[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) brow[nt] = b + static_cast<int64_t>(min(nt * 8 + g, ntok - 1)) * K;
  ZeroAcc<1, NT>(acc);
#pragma unroll 1
  for (int64_t kb = 0; kb < K; kb += 256) {
    RawK<1, 2> r;
    LoadRaw<1, 2>(a, kb, c, r);
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      uint32_t s2[1][2][2];
      Scales<1, 2>(r, st, s2);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t fa[1][2][4];
        DecodeWord<1, 2>(r, s2, st, j, fa);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint4 bv = __ldg(reinterpret_cast<const uint4*>(brow[nt] + kb + 128 * st + 32 * j + 8 * c));
          MmaPair<1>(fa, bv, acc[nt]);
        }
      }
    }
  }
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void CpAsyncWaitOne() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

// Large tiles: two slices × 32 tokens, B staged in shared memory (all 64 threads of the
// block copy; both warps read), 128 columns a step, weights one step ahead in registers.
__device__ __forceinline__ void LargeBlockTile(const RowPair (&a)[2], const uint16_t* b, int64_t K, int ntok,
                                               uint8_t* bsm, float (&acc)[4][2][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  ZeroAcc<2, 4>(acc);
  auto stage_b = [&](int stage, int64_t kb) {
#pragma unroll
    for (int q = 0; q < 32 * 16 / kThreads; ++q) {
      const int idx = threadIdx.x + kThreads * q, t = idx >> 4, ch = idx & 15;
      CpAsync16(bsm + stage * kStageBytes + t * kRowBytes + ch * 16,
                b + static_cast<int64_t>(min(t, ntok - 1)) * K + kb + ch * 8);
    }
    CpAsyncCommit();
  };
  RawK<2, 1> cur;
  stage_b(0, 0);
  LoadRaw<2, 1>(a, 0, c, cur);
  int stage = 0;
#pragma unroll 1
  for (int64_t kb = 0; kb < K; kb += 128, stage ^= 1) {
    RawK<2, 1> nxt;
    if (kb + 128 < K) {
      stage_b(stage ^ 1, kb + 128);
      LoadRaw<2, 1>(a, kb + 128, c, nxt);
    } else {
      CpAsyncCommit();  // an empty group keeps "all but the newest" meaning this stage
    }
    CpAsyncWaitOne();
    __syncthreads();
    const uint8_t* sb = bsm + stage * kStageBytes;
    uint32_t s2[2][2][2];
    Scales<2, 1>(cur, 0, s2);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t fa[2][2][4];
      DecodeWord<2, 1>(cur, s2, 0, j, fa);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const uint4 bv = *reinterpret_cast<const uint4*>(sb + (nt * 8 + g) * kRowBytes + (4 * j + c) * 16);
        MmaPair<2>(fa, bv, acc[nt]);
      }
    }
    __syncthreads();  // the stage is refilled two steps on
    cur = nxt;
  }
}

// h = bf16(silu(bf16(g)) · bf16(u)) for rows i0 + g (+8), tokens 8nt + 2c (+1), stored at
// the permuted column for the down GEMM. acc[nt][gm] gate, acc[nt][um] up.
template <int NT, int M>
__device__ __forceinline__ void StoreH(const float (&acc)[NT][M][4], int gm, const float (&up)[NT][M][4], int um,
                                       float sg, float su, uint16_t* h, int64_t I, int64_t row0, int ntok, int64_t i0,
                                       int lane) {
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int tok = nt * 8 + 2 * c + (q & 1);
      if (tok >= ntok) continue;
      const int64_t i = i0 + g + ((q & 2) ? 8 : 0);
      const float gv = RoundBf16(acc[nt][gm][q] * sg), uv = RoundBf16(up[nt][um][q] * su);
      h[(row0 + tok) * I + MoePermCol(i)] = DevF32ToBf16(Silu(gv) * uv);
    }
}

// y rows i0 + g (+8) of slice m, fp32.
template <int NT, int M>
__device__ __forceinline__ void StoreY(const float (&acc)[NT][M][4], int m, float sd, float* y, int64_t L, int64_t row0,
                                       int ntok, int64_t i0, int lane) {
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int tok = nt * 8 + 2 * c + (q & 1);
      if (tok >= ntok) continue;
      const int64_t i = i0 + g + ((q & 2) ? 8 : 0);
      y[(row0 + tok) * L + i] = acc[nt][m][q] * sd;
    }
}

template <bool kGateUp, int NT>
__device__ __forceinline__ void RunSmall(const MoeExpertParams& p, const MoeWork& w, const MoeExpertWeights& ew,
                                         int64_t block_row, int64_t row0, int ntok, int warp, int lane,
                                         float (*xchg)[1][4][32]) {
  const int g = lane >> 2;
  float acc[NT][1][4];
  RowPair a[1];
  if constexpr (kGateUp) {
    a[0] = MakeRowPair(warp == 0 ? ew.gate : ew.up, block_row, g);
    SmallWarpTile<NT>(a, w.xg + row0 * p.width, p.width, ntok, lane, acc);
    if (warp == 1) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int q = 0; q < 4; ++q) xchg[nt][0][q][lane] = acc[nt][0][q];
    }
    __syncthreads();
    if (warp == 0) {
      float up[NT][1][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int q = 0; q < 4; ++q) up[nt][0][q] = xchg[nt][0][q][lane];
      StoreH<NT, 1>(acc, 0, up, 0, ew.gate.scale2 * 256.f, ew.up.scale2 * 256.f, static_cast<uint16_t*>(w.h), p.inter,
                    row0, ntok, block_row, lane);
    }
    __syncthreads();
  } else {
    const int64_t i0 = block_row + 16 * warp;
    a[0] = MakeRowPair(ew.down, i0, g);
    SmallWarpTile<NT>(a, static_cast<const uint16_t*>(w.h) + row0 * p.inter, p.inter, ntok, lane, acc);
    StoreY<NT, 1>(acc, 0, ew.down.scale2 * 256.f, w.y, p.width, row0, ntok, i0, lane);
  }
}

template <bool kGateUp>
__device__ __forceinline__ void RunLarge(const MoeExpertParams& p, const MoeWork& w, const MoeExpertWeights& ew,
                                         int64_t block_row, int64_t row0, int ntok, int warp, int lane, uint8_t* bsm) {
  const int g = lane >> 2;
  float acc[4][2][4];
  RowPair a[2];
  if constexpr (kGateUp) {
    const int64_t i0 = block_row + 16 * warp;
    a[0] = MakeRowPair(ew.gate, i0, g);
    a[1] = MakeRowPair(ew.up, i0, g);
    LargeBlockTile(a, w.xg + row0 * p.width, p.width, ntok, bsm, acc);
    StoreH<4, 2>(acc, 0, acc, 1, ew.gate.scale2 * 256.f, ew.up.scale2 * 256.f, static_cast<uint16_t*>(w.h), p.inter,
                 row0, ntok, i0, lane);
  } else {
    const int64_t i0 = block_row + 32 * warp;
    a[0] = MakeRowPair(ew.down, i0, g);
    a[1] = MakeRowPair(ew.down, i0 + 16, g);
    LargeBlockTile(a, static_cast<const uint16_t*>(w.h) + row0 * p.inter, p.inter, ntok, bsm, acc);
    StoreY<4, 2>(acc, 0, ew.down.scale2 * 256.f, w.y, p.width, row0, ntok, i0, lane);
    StoreY<4, 2>(acc, 1, ew.down.scale2 * 256.f, w.y, p.width, row0, ntok, i0 + 16, lane);
  }
}

// Rows per block: small gate/up 16 (gate and up of them), small down 32, large gate/up 32,
// large down 64.
__host__ __device__ constexpr int BlockRows(bool gate_up, bool large) { return (large ? 2 : 1) * (gate_up ? 16 : 32); }

template <bool kGateUp, bool kLarge>
__global__ void __launch_bounds__(kThreads, kLarge ? 6 : 10) FastKernel(MoeExpertParams p, MoeWork w) {
  __shared__ float xchg[2][1][4][32];  // small gate/up: up's accumulators
  __shared__ __align__(16) uint8_t bsm[kLarge ? 2 * kStageBytes : 16];
  const int E = p.num_local_experts;
  const int64_t N = kGateUp ? p.inter : p.width;
  const int64_t blocks_per_tile = N / BlockRows(kGateUp, kLarge);
  const int64_t total = static_cast<int64_t>(w.tile_base[E]) * blocks_per_tile;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int e = 0;
  for (int64_t item = blockIdx.x; item < total; item += gridDim.x) {
    while (static_cast<int64_t>(w.tile_base[e + 1]) * blocks_per_tile <= item) ++e;
    const int64_t local = item - static_cast<int64_t>(w.tile_base[e]) * blocks_per_tile;
    const int32_t begin = w.offsets[e], count = w.offsets[e + 1] - begin;
    const int tiles = (count + kMoeTileTokens - 1) / kMoeTileTokens;
    const int64_t rb = local / tiles;
    const int tile = static_cast<int>(local % tiles);
    const int ntok = min(kMoeTileTokens, count - tile * kMoeTileTokens);
    if ((ntok > 16) != kLarge) continue;
    const int64_t row0 = begin + static_cast<int64_t>(tile) * kMoeTileTokens;
    const int64_t block_row = rb * BlockRows(kGateUp, kLarge);
    const MoeExpertWeights& ew = p.experts[e];
    if constexpr (kLarge) {
      RunLarge<kGateUp>(p, w, ew, block_row, row0, ntok, warp, lane, bsm);
    } else if (ntok <= 8) {
      RunSmall<kGateUp, 1>(p, w, ew, block_row, row0, ntok, warp, lane, xchg);
    } else {
      RunSmall<kGateUp, 2>(p, w, ew, block_row, row0, ntok, warp, lane, xchg);
    }
  }
}

template <bool kGateUp, bool kLarge>
cudaError_t LaunchClass(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  static const int blocks_per_sm = [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, FastKernel<kGateUp, kLarge>, kThreads, 0) != cudaSuccess) {
      n = 1;
    }
    return std::max(n, 1);
  }();
  const int64_t N = kGateUp ? p.inter : p.width;
  const int64_t pairs = p.num_tokens * p.top_k;
  const int64_t max_tiles = std::min<int64_t>(p.num_local_experts, pairs) + pairs / kMoeTileTokens;
  const int64_t items = max_tiles * (N / BlockRows(kGateUp, kLarge));
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(items, int64_t{blocks_per_sm} * w.num_sms));
  FastKernel<kGateUp, kLarge><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(p, w);
  return cudaGetLastError();
}

template <bool kGateUp>
cudaError_t LaunchFast(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  if (cudaError_t err = LaunchClass<kGateUp, false>(p, w, stream); err != cudaSuccess) return err;
  // Tiles of more than 16 tokens exist only when some expert has more than 16 rows.
  if (p.num_tokens * p.top_k > 16) return LaunchClass<kGateUp, true>(p, w, stream);
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchMoeFastGateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return LaunchFast<true>(p, w, stream);
}

cudaError_t LaunchMoeFastDown(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return LaunchFast<false>(p, w, stream);
}

}  // namespace moeshard::gpu
