// The GEMV/mma path's experts (Q8_0, MXFP4, BF16 with bf16 activations) at prefill sizes, on
// Hopper's warpgroup MMA (MoeWork::wgmma; moe_expert.cc says when). Four kernels:
//   1. gather: each grouped row's x, in natural column order, into the y buffer (which the down
//      GEMM overwrites later);
//   2. expand: every local expert that has rows, gate/up/down decoded once to bf16 into the
//      workspace (MoeWork::wexp): gate and up interleaved eight rows at a time ([2I, L]: rows
//      16j..16j+7 are gate rows 8j.., 16j+8..16j+15 up rows 8j..), down as [L, I]. MXFP4 and BF16
//      values are exact in bf16; a Q8_0 value d·q is rounded to bf16 (8 significant bits);
//   3. gate/up GEMM: tiles of 128 rows of one expert x 128 interleaved weight rows, K in steps
//      of 64; the epilogue forms h = bf16(silu(bf16(g)) · bf16(u)) (as moe_gemv.cu) for the
//      tile's 64 intermediate columns;
//   4. down GEMM: the same tiles over h, y rows fp32.
// MOESHARD_MOE_WGMMA_DECODE=1 (not yet run on a GPU, off by default) replaces 2 and the weight
// copies of 3 and 4 with a decoding producer: warpgroups 0 and 1 read the stored blocks (each
// thread one 32-column block of one weight row a step, its raw bytes three steps ahead by
// cp.async into a ring of its own), decode them to bf16 and store them into the weight slot in
// the swizzled layout, so no expansion pass and no bf16 copy of the weights.
// The GEMM is persistent (one CTA an SM, tiles strided over the grid, the weight tile fastest so
// that CTAs running together share an expert's weights in L2) and warp-specialized: one thread
// of warpgroup 0 feeds a four-slot ring with two tensor-map copies a slot (128 rows x 64
// bf16 of the rows' activations and of the weights, 128-byte swizzled), warpgroups 1 and 2 each
// multiply 64 of the tile's rows (m64n128k16, both operands in shared memory) and free a slot
// once the MMAs that read it are done, so the copies of the next tile run under an epilogue.
// Rows past an expert's count compute on the next expert's rows (or zeros past the buffer) and
// are not stored. Every sum runs in a fixed order: results repeat bit for bit.
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/tensor_map.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/moe/moe_block_decode.h"
#include "kernels/moe/moe_device.cuh"
#include "kernels/moe/moe_launch.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOESHARD_MOE_WGMMA_DEVICE 1
#endif

namespace moeshard::gpu {
namespace {

constexpr int kTM = 128, kTN = 128, kTK = 64, kStages = 4, kThreads = 384;
constexpr uint32_t kTileBytes = kTM * kTK * 2;  // an activation tile and a weight tile alike

// The ring's activation and weight slots, the decoding producer's raw-byte ring, the m-tile prefix.
size_t GemmSmemBytes(int E, bool decode) {
  return 1024 + 2 * size_t{kStages} * kTileBytes + (decode ? size_t{kStages} * 256 * 64 : 0) +
         sizeof(int32_t) * (E + 1);
}

// MOESHARD_MOE_WGMMA_DECODE=1: the decoding producer instead of the expansion pass and
// tensor-map weight tiles. Written and compiled (2026-12-03, seventh session), not yet run on a
// GPU: off until moe_expert_test passes with it and moe_expert_bench shows it faster.
bool ExpandPass() {
  static const bool expand = [] {
    const char* v = std::getenv("MOESHARD_MOE_WGMMA_DECODE");
    return !(v && v[0] == '1');
  }();
  return expand;
}

struct WgGemmArgs {
  const MoeExpertWeights* experts;  // the decoding GEMM's weights (device array)
  const int32_t* offsets;
  const uint8_t* fast;
  int E;
  int K;        // L (gate/up) or I (down)
  int n_tiles;  // weight rows of an expert / kTN
  uint16_t* h;  // gate/up: h [capacity, I] bf16
  int64_t inter;
  float* y;  // down: y [capacity, L] fp32
  int64_t width;
};

#ifdef MOESHARD_MOE_WGMMA_DEVICE
// Tile t's expert, first row (within the expert) and first weight row, from the prefix of
// m-tiles per expert in shared memory.
__device__ __forceinline__ void TileAt(const int32_t* mt_base, int E, int n_tiles, int t, int& e, int& m0, int& n0) {
  const int mt = t / n_tiles;
  n0 = (t % n_tiles) * kTN;
  int lo = 0, hi = E - 1;  // the last e with mt_base[e] <= mt
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (mt_base[mid] <= mt) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  e = lo;
  m0 = (mt - mt_base[e]) * kTM;
}
#endif

#ifdef MOESHARD_MOE_WGMMA_DEVICE
// Warp 0: m-tiles per expert (GEMV-path experts only), as an exclusive prefix into mt_base[E + 1].
__device__ __forceinline__ void TilePrefix(const WgGemmArgs& a, int32_t* mt_base, int lane) {
  int run = 0;
  for (int e0 = 0; e0 < a.E; e0 += 32) {
    const int e = e0 + lane;
    int v = 0;
    if (e < a.E && a.fast[e] == kMoePathGemv) v = (__ldcg(a.offsets + e + 1) - __ldcg(a.offsets + e) + kTM - 1) / kTM;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int u = __shfl_up_sync(~0u, v, o);
      if (lane >= o) v += u;
    }
    if (e < a.E) mt_base[e + 1] = run + v;
    run += __shfl_sync(~0u, v, 31);
  }
  if (lane == 0) mt_base[0] = 0;
}

// A consumer warpgroup (cw 0 or 1: the tile's rows 64·cw..): every tile of this CTA through the
// ring, then its epilogue.
template <bool kGateUp>
__device__ __forceinline__ void ConsumeTiles(const WgGemmArgs& a, const int32_t* mt_base, int total, int nk,
                                             uint8_t* a_tiles, uint8_t* b_tiles, uint64_t* full, uint64_t* empty,
                                             int cw, int warp, int lane) {
  const int wr = (warp % 4) * 16 + lane / 4, tq = lane % 4;
  uint32_t cnt = 0;
  for (int t = blockIdx.x; t < total; t += gridDim.x) {
    int e, m0, n0;
    TileAt(mt_base, a.E, a.n_tiles, t, e, m0, n0);
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    for (int k = 0; k < nk; ++k, ++cnt) {
      const int s = cnt % kStages;
      MbarrierWait(&full[s], (cnt / kStages) & 1);
      const uint32_t a_addr = SharedAddr(a_tiles + s * kTileBytes) + cw * 64 * 128;
      const uint32_t b_addr = SharedAddr(b_tiles + s * kTileBytes);
      WgmmaFence();
#pragma unroll
      for (int ks = 0; ks < kTK / 16; ++ks) {
        WgmmaSS128(acc, WgmmaDesc(a_addr + ks * 32, 16, 1024), WgmmaDesc(b_addr + ks * 32, 16, 1024), 1);
      }
      WgmmaCommit();
      WgmmaWait<1>();
      if (k > 0) MbarrierArrive(&empty[(cnt - 1) % kStages]);
    }
    WgmmaWait<0>();
    WgmmaPin(acc);
    MbarrierArrive(&empty[(cnt - 1) % kStages]);
    const int count = __ldcg(a.offsets + e + 1) - __ldcg(a.offsets + e);
    const int64_t row_base = __ldcg(a.offsets + e);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m0 + cw * 64 + wr + 8 * half;
      if (r >= count) continue;
      const int64_t row = row_base + r;
      if constexpr (kGateUp) {
        uint32_t* hrow = reinterpret_cast<uint32_t*>(a.h + row * a.inter + n0 / 2 + 2 * tq);
#pragma unroll
        for (int i = 0; i < 16; i += 2) {
          float hv[2];
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const float g = RoundBf16(acc[4 * i + 2 * half + j]), u = RoundBf16(acc[4 * (i + 1) + 2 * half + j]);
            hv[j] = Silu(g) * u;
          }
          hrow[(i / 2) * 4] = uint32_t{DevF32ToBf16(hv[0])} | (uint32_t{DevF32ToBf16(hv[1])} << 16);
        }
      } else {
        float* yrow = a.y + row * a.width + n0 + 2 * tq;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          *reinterpret_cast<float2*>(yrow + 8 * i) = make_float2(acc[4 * i + 2 * half], acc[4 * i + 2 * half + 1]);
        }
      }
    }
  }
}

// The decoding producer's view of one (tile, k-step): thread pt (0..255) owns weight row pt / 2
// of the tile (the interleaved gate/up order, or down's) and its 32-column block pt % 2 of the step.
struct DecodeCursor {
  int t = 0, k = 0, tile = -1;
  const uint8_t* row = nullptr;  // the thread's stored row
  int64_t col0 = 0;              // the view's first stored column
  WeightFormat fmt = WeightFormat::kBF16;
};

template <bool kGateUp>
__device__ __forceinline__ void CursorLoad(DecodeCursor& c, const WgGemmArgs& a, const int32_t* mt_base, int pt) {
  if (c.tile == c.t) return;
  c.tile = c.t;
  int e, m0, n0;
  TileAt(mt_base, a.E, a.n_tiles, c.t, e, m0, n0);
  const int q = n0 + pt / 2;
  const MoeExpertWeights& ex = a.experts[e];
  const WeightRef& v = kGateUp ? ((q & 15) < 8 ? ex.gate : ex.up) : ex.down;
  const int64_t src = kGateUp ? (q >> 4) * 8 + (q & 7) : q;
  c.row = v.data + src * v.row_stride_bytes;
  c.col0 = v.col_offset;
  c.fmt = v.format;
}

// The step's block address of this thread (16-byte aligned for BF16, any byte for the others).
__device__ __forceinline__ const uint8_t* BlockAddr(const DecodeCursor& c, int pt) {
  const int64_t gb = 2 * c.k + (pt & 1);
  switch (c.fmt) {
    case WeightFormat::kQ8_0:
      return c.row + (c.col0 / 32 + gb) * 34;
    case WeightFormat::kMXFP4:
      return c.row + (c.col0 / 32 + gb) * 17;
    default:
      return c.row + 2 * (c.col0 + 32 * gb);
  }
}

// The raw bytes of the cursor's block into this thread's 64-byte slot (one cp.async group):
// 16-byte copies for BF16, 4-byte ones aligned down for the others (moe_block_decode.h).
__device__ __forceinline__ void IssueRaw(const DecodeCursor& c, int pt, uint8_t* slot) {
  const uint8_t* p = BlockAddr(c, pt);
  if (c.fmt == WeightFormat::kBF16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) CpAsync16(slot + 16 * i, p + 16 * i, true);
  } else {
    const uint8_t* a0 = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t{3});
    const int words = block_decode::RawWords(c.fmt);
    for (int i = 0; i < words; ++i) CpAsync4(slot + 4 * i, a0 + 4 * i, true);
  }
}

// The thread's 32 weights of the step as bf16, natural order, into out[16].
__device__ __forceinline__ void DecodeRaw(const DecodeCursor& c, int pt, const uint8_t* slot, uint32_t out[16]) {
  uint32_t w[block_decode::kRawWords];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 v = reinterpret_cast<const uint4*>(slot)[i];
    w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
  }
  const int off =
      c.fmt == WeightFormat::kBF16 ? 0 : static_cast<int>(reinterpret_cast<uintptr_t>(BlockAddr(c, pt)) & 3);
  block_decode::DecodeBlock(c.fmt, w, off, out);
}

__device__ __forceinline__ void CursorNext(DecodeCursor& c, int nk) {
  if (++c.k == nk) c.k = 0, c.t += gridDim.x;
}
#endif

// kDecode false: 384 threads, warpgroup 0's thread 0 copies activation and (expanded) weight tiles
// by tensor map. kDecode true: 512 threads, warpgroups 0 and 1 decode the stored weights (each
// thread one 32-column block of one row a step, its raw bytes three steps ahead by cp.async into
// a ring of its own) straight into the swizzled weight slot, thread 0 copies the activations by
// tensor map; no expansion pass.
template <bool kGateUp, bool kDecode>
__global__ void __launch_bounds__(kDecode ? 512 : kThreads, 1)
    WgmmaGemmKernel(WgGemmArgs a, const __grid_constant__ CUtensorMap amap, const __grid_constant__ CUtensorMap bmap) {
#ifdef MOESHARD_MOE_WGMMA_DEVICE
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = SharedAddr(smem_raw);
  uint8_t* sm = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  uint8_t* a_tiles = sm;
  uint8_t* b_tiles = sm + kStages * kTileBytes;
  uint8_t* raw_ring = b_tiles + kStages * kTileBytes;  // kDecode: [kStages][256 threads][64 bytes]
  int32_t* mt_base = reinterpret_cast<int32_t*>(raw_ring + (kDecode ? kStages * 256 * 64 : 0));  // [E + 1]
  __shared__ alignas(8) uint64_t full[kStages], empty[kStages];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wg = warp / 4;
  PdlWait();
  PdlTrigger();
  if (warp == 0) TilePrefix(a, mt_base, lane);
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      MbarrierInit(&full[i], kDecode ? 257 : 1);
      MbarrierInit(&empty[i], 256);
    }
    FenceMbarrierInit();
  }
  __syncthreads();
  const int total = mt_base[a.E] * a.n_tiles;
  const int nk = a.K / kTK;
  if constexpr (!kDecode) {
    if (wg == 0) {
      RegsDecrease<40>();
      if (tid == 0) {
        uint32_t cnt = 0;
        for (int t = blockIdx.x; t < total; t += gridDim.x) {
          int e, m0, n0;
          TileAt(mt_base, a.E, a.n_tiles, t, e, m0, n0);
          const int arow = __ldcg(a.offsets + e) + m0, brow = e * a.n_tiles * kTN + n0;
          for (int k = 0; k < nk; ++k, ++cnt) {
            const int s = cnt % kStages;
            MbarrierWait(&empty[s], ((cnt / kStages) & 1) ^ 1);
            MbarrierArriveExpectTx(&full[s], 2 * kTileBytes);
            TensorCopy2dToShared(a_tiles + s * kTileBytes, &amap, k * kTK, arow, &full[s]);
            TensorCopy2dToShared(b_tiles + s * kTileBytes, &bmap, k * kTK, brow, &full[s]);
          }
        }
      }
    } else {
      RegsIncrease<232>();
      ConsumeTiles<kGateUp>(a, mt_base, total, nk, a_tiles, b_tiles, full, empty, wg - 1, warp, lane);
    }
  } else {
    if (wg < 2) {
      const int pt = tid;  // 0..255
      const int r = pt / 2, cb = (pt & 1) * 4;
      uint8_t* my_raw = raw_ring + pt * 64;
      DecodeCursor is, ds;  // the copies' cursor (three steps ahead) and the decode's
      is.t = ds.t = blockIdx.x;
      const uint32_t stages = total > static_cast<int>(blockIdx.x)
                                  ? static_cast<uint32_t>(((total - 1 - blockIdx.x) / gridDim.x + 1) * nk)
                                  : 0u;
      for (int i = 0; i < kStages - 1; ++i) {
        if (static_cast<uint32_t>(i) < stages) {
          CursorLoad<kGateUp>(is, a, mt_base, pt);
          IssueRaw(is, pt, my_raw + i * 256 * 64);
          CursorNext(is, nk);
        }
        CpCommit();
      }
      for (uint32_t cnt = 0; cnt < stages; ++cnt) {
        const int s = cnt % kStages;
        if (cnt + kStages - 1 < stages) {
          CursorLoad<kGateUp>(is, a, mt_base, pt);
          IssueRaw(is, pt, my_raw + ((cnt + kStages - 1) % kStages) * 256 * 64);
          CursorNext(is, nk);
        }
        CpCommit();
        CpWait<kStages - 1>();
        CursorLoad<kGateUp>(ds, a, mt_base, pt);
        MbarrierWait(&empty[s], ((cnt / kStages) & 1) ^ 1);
        if (pt == 0) {
          int e, m0, n0;
          TileAt(mt_base, a.E, a.n_tiles, ds.t, e, m0, n0);
          MbarrierArriveExpectTx(&full[s], kTileBytes);
          TensorCopy2dToShared(a_tiles + s * kTileBytes, &amap, ds.k * kTK, __ldcg(a.offsets + e) + m0, &full[s]);
        }
        uint32_t out[16];
        DecodeRaw(ds, pt, my_raw + s * 256 * 64, out);
        uint8_t* slot = b_tiles + s * kTileBytes + r * 128;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          *reinterpret_cast<uint4*>(slot + (((cb + i) ^ (r & 7)) << 4)) =
              make_uint4(out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]);
        }
        FenceProxyAsyncShared();
        MbarrierArrive(&full[s]);
        CursorNext(ds, nk);
      }
    } else {
      ConsumeTiles<kGateUp>(a, mt_base, total, nk, a_tiles, b_tiles, full, empty, wg - 2, warp, lane);
    }
  }
#else
  __trap();  // built without sm_90a: MoeWgmmaSupported() is false and nothing launches this
#endif
}

// xg[r] = x[rows[r] / top_k] for every grouped row, 16 bytes a thread.
__global__ void GatherNaturalKernel(const uint16_t* x, int64_t L, int top_k, const int32_t* rows,
                                    const int32_t* offsets, int E, uint16_t* xg) {
  PdlWait();
  PdlTrigger();
  const int64_t chunks = L / 8, n = static_cast<int64_t>(__ldcg(offsets + E)) * chunks;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / chunks, c = i % chunks;
    const int64_t tok = __ldcg(rows + r) / top_k;
    reinterpret_cast<uint4*>(xg + r * L)[c] = reinterpret_cast<const uint4*>(x + tok * L)[c];
  }
}

// 32 values of one block of `w` (row, columns 32b..32b+31) as bf16 into dst (16-byte aligned):
// BF16 copied, Q8_0 and MXFP4 through the decoding producer's block decode (moe_block_decode.h),
// from the block's own bytes (none past it is read).
__device__ __forceinline__ void ExpandBlock(const WeightRef& w, int64_t row, int64_t b, uint16_t* dst) {
  const uint8_t* r = w.data + row * w.row_stride_bytes;
  if (w.format == WeightFormat::kBF16) {
    const uint4* src = reinterpret_cast<const uint4*>(r + 2 * (w.col_offset + 32 * b));
#pragma unroll
    for (int i = 0; i < 4; ++i) reinterpret_cast<uint4*>(dst)[i] = __ldg(src + i);
    return;
  }
  const int bytes = w.format == WeightFormat::kQ8_0 ? 34 : 17;
  const uint8_t* p = r + (w.col_offset / 32 + b) * bytes;
  uint32_t words[block_decode::kRawWords] = {};
#pragma unroll
  for (int i = 0; i < 34; ++i) {
    if (i < bytes) words[i / 4] |= uint32_t{__ldg(p + i)} << (8 * (i % 4));
  }
  uint32_t out[16];
  block_decode::DecodeBlock(w.format, words, 0, out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    reinterpret_cast<uint4*>(dst)[i] = make_uint4(out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]);
  }
}

// blockIdx.y = expert; threads over the expert's 32-column blocks: gate, up, then down.
__global__ void ExpandKernel(const MoeExpertParams p, const MoeWork w) {
  PdlWait();
  PdlTrigger();
  const int e = blockIdx.y;
  if (w.fast[e] != kMoePathGemv || __ldcg(w.offsets + e + 1) == __ldcg(w.offsets + e)) return;
  const int64_t L = p.width, I = p.inter, gu_blocks = I * (L / 32), d_blocks = L * (I / 32);
  const MoeExpertWeights& ew = p.experts[e];
  uint16_t* gu = w.wexp + static_cast<int64_t>(e) * 2 * I * L;
  uint16_t* dn = w.wexp + static_cast<int64_t>(p.num_local_experts) * 2 * I * L + static_cast<int64_t>(e) * L * I;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < 2 * gu_blocks + d_blocks;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (i < 2 * gu_blocks) {
      const bool up = i >= gu_blocks;
      const int64_t j = up ? i - gu_blocks : i, row = j / (L / 32), b = j % (L / 32);
      const int64_t dst_row = (row / 8) * 16 + (up ? 8 : 0) + row % 8;
      ExpandBlock(up ? ew.up : ew.gate, row, b, gu + dst_row * L + 32 * b);
    } else {
      const int64_t j = i - 2 * gu_blocks, row = j / (I / 32), b = j % (I / 32);
      ExpandBlock(ew.down, row, b, dn + row * I + 32 * b);
    }
  }
}

// A [rows, cols] bf16 row-major tensor, boxes of 128 rows x 64 columns, 128-byte swizzled.
cudaError_t EncodeMap(const void* base, int64_t rows, int64_t cols, CUtensorMap* map) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols * 2)};
  const cuuint32_t box[2] = {kTK, kTM}, elem[2] = {1, 1};
  const CUresult r = TensorMapEncoder()(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims,
                                        strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <bool kGateUp, bool kDecode>
cudaError_t LaunchGemmAs(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  const int E = p.num_local_experts;
  const int64_t L = p.width, I = p.inter, K = kGateUp ? L : I, n_rows = kGateUp ? 2 * I : L;
  CUtensorMap amap, bmap;
  const void* act = kGateUp ? static_cast<const void*>(w.y) : w.h;  // gate/up: the gathered x in y
  if (cudaError_t err = EncodeMap(act, w.capacity, K, &amap); err != cudaSuccess) return err;
  bmap = amap;  // the decoding producer reads the stored weights itself
  if (!kDecode) {
    const uint16_t* wts = kGateUp ? w.wexp : w.wexp + static_cast<int64_t>(E) * 2 * I * L;
    if (cudaError_t err = EncodeMap(wts, E * n_rows, K, &bmap); err != cudaSuccess) return err;
  }
  WgGemmArgs a{
      p.experts, w.offsets, w.fast, E, static_cast<int>(K), static_cast<int>(n_rows / kTN), static_cast<uint16_t*>(w.h),
      I,         w.y,       L};
  const size_t smem = GemmSmemBytes(E, kDecode);
  static std::atomic<size_t> smem_set{0};
  if (smem_set.load(std::memory_order_relaxed) < smem) {
    const size_t most = GemmSmemBytes(kMoeWgmmaMaxExperts, kDecode);
    if (cudaError_t err = cudaFuncSetAttribute(WgmmaGemmKernel<kGateUp, kDecode>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(most));
        err != cudaSuccess) {
      return err;
    }
    smem_set.store(most, std::memory_order_relaxed);
  }
  // Tiles: at most capacity / kTM + E m-tiles (each expert's last one partial) times n_tiles.
  const int64_t most_tiles = (w.capacity / kTM + E) * (n_rows / kTN);
  const unsigned grid = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(most_tiles, w.num_sms)));
  return LaunchPdl(WgmmaGemmKernel<kGateUp, kDecode>, grid, kDecode ? 512 : kThreads, smem, stream, a, amap, bmap);
}

template <bool kGateUp>
cudaError_t LaunchGemm(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return ExpandPass() ? LaunchGemmAs<kGateUp, false>(p, w, stream) : LaunchGemmAs<kGateUp, true>(p, w, stream);
}

}  // namespace

bool MoeWgmmaSupported() {
#ifndef MOESHARD_HAVE_SM90A
  return false;
#else
  return DeviceIsSm90() && TensorMapEncoder() != nullptr;
#endif
}

cudaError_t LaunchMoeWgmmaGateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  const int64_t chunks = w.capacity * (p.width / 8);
  const unsigned gblocks =
      static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((chunks + 255) / 256, 16 * w.num_sms)));
  if (cudaError_t err =
          LaunchPdl(GatherNaturalKernel, gblocks, 256, 0, stream, static_cast<const uint16_t*>(p.x), p.width, p.top_k,
                    static_cast<const int32_t*>(w.rows), static_cast<const int32_t*>(w.offsets), p.num_local_experts,
                    reinterpret_cast<uint16_t*>(w.y));
      err != cudaSuccess) {
    return err;
  }
  const int64_t blocks = 3 * p.inter * (p.width / 32);
  const dim3 egrid(static_cast<unsigned>(std::min<int64_t>((blocks + 255) / 256, 64)),
                   static_cast<unsigned>(p.num_local_experts));
  if (ExpandPass()) {
    if (cudaError_t err = LaunchPdl(ExpandKernel, egrid, 256, 0, stream, p, w); err != cudaSuccess) return err;
  }
  return LaunchGemm<true>(p, w, stream);
}

cudaError_t LaunchMoeWgmmaDown(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return LaunchGemm<false>(p, w, stream);
}

}  // namespace moeshard::gpu
