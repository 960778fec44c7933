// The GEMV/mma path's experts (Q8_0, MXFP4, BF16 with bf16 activations) at prefill sizes, on
// Hopper's warpgroup MMA (MoeWork::wgmma; moe_expert.cc says when). Four kernels:
//   1. gather: each grouped row's x, in natural column order, into the y buffer (which the down
//      GEMM overwrites later);
//   2. expand: every local expert that has rows, gate/up/down decoded once to bf16 into the
//      workspace (MoeWork::wexp): gate and up interleaved eight rows at a time ([2I, L]: rows
//      16j..16j+7 are gate rows 8j.., 16j+8..16j+15 up rows 8j..), down as [L, I]. MXFP4 and BF16
//      values are exact in bf16; a Q8_0 value d·q is rounded to bf16 (8 significant bits);
//   3. gate/up GEMM: tiles of 128 rows of one expert x kTN (256, or 128 where the sizes need it)
//      interleaved weight rows, K in steps of 64; the epilogue forms
//      h = bf16(silu(bf16(g)) · bf16(u)) (as moe_gemv.cu) for the tile's kTN / 2 intermediate columns;
//   4. down GEMM: the same tiles over h, y rows fp32.
// The GEMM is persistent (one CTA an SM, tiles strided over the grid, the weight tile fastest so
// that CTAs running together share an expert's weights in L2) and warp-specialized: one thread
// of warpgroup 0 feeds a four-slot ring with two tensor-map copies a slot (128 rows x 64 bf16 of
// the rows' activations, kTN x 64 of the weights, 128-byte swizzled), warpgroups 1 and 2 each
// multiply 64 of the tile's rows (m64nkTNk16, both operands in shared memory) and free a slot
// once the MMAs that read it are done, so the copies of the next tile run under an epilogue.
// 128 x 256 tiles: the operands' traffic from L2 is what bounds 128 x 128 tiles (64 FLOP a byte
// with K = 2,048); 128 x 256 carry 85. A warpgroup whose 64 rows all lie past the expert's count
// (the partial last m-tile) skips its MMAs. Rows past an expert's count otherwise compute on the
// next expert's rows (or zeros past the buffer) and are not stored. Every sum runs in a fixed
// order: results repeat bit for bit.
// (A decoding producer that fed the weight slots from the stored blocks without the expansion
// pass was measured on the H200 on 2026-12-04 and taken out: correct, but its two decoding
// warpgroups bound the GEMM, 2,753 against 1,674 us at T = 4,096; kernels/moe/PERF_NOTES.md.)
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/tensor_map.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/moe/moe_block_decode.h"
#include "kernels/moe/moe_device.cuh"
#include "kernels/moe/moe_launch.h"
#include "kernels/moe/moe_stream_decode.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOESHARD_MOE_WGMMA_DEVICE 1
#endif

namespace moeshard::gpu {
namespace {

constexpr int kTM = 128, kTK = 64, kStages = 4, kThreads = 384;
constexpr uint32_t kATileBytes = kTM * kTK * 2;  // an activation tile
template <int kTN>
constexpr uint32_t kBTileBytes = kTN* kTK * 2;  // a weight tile

// The ring's activation and weight slots, the m-tile prefix.
template <int kTN>
size_t GemmSmemBytes(int E) {
  return 1024 + size_t{kStages} * (kATileBytes + kBTileBytes<kTN>)+sizeof(int32_t) * (E + 1);
}

// The weight tile's rows: 256 where the sizes allow (L a multiple of 256, I of 128) unless
// MOESHARD_MOE_WGMMA_TN=128.
bool WideTiles(int64_t L, int64_t I) {
  static const bool allow = [] {
    const char* v = std::getenv("MOESHARD_MOE_WGMMA_TN");
    return !(v && std::strcmp(v, "128") == 0);
  }();
  return allow && L % 256 == 0 && I % 128 == 0;
}

struct WgGemmArgs {
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
// Tile t's expert, first row (within the expert) and first weight row.
template <int kTN>
__device__ __forceinline__ void TileAt(const int32_t* mt_base, int E, int n_tiles, int t, int& e, int& m0, int& n0) {
  n0 = (t % n_tiles) * kTN;
  MoeTileOf(mt_base, E, t / n_tiles, e, m0);
  m0 *= kTM;
}

// A consumer warpgroup (cw 0 or 1: the tile's rows 64·cw..): every tile of this CTA through the
// ring, then its epilogue.
template <bool kGateUp, int kTN>
__device__ __forceinline__ void ConsumeTiles(const WgGemmArgs& a, const int32_t* mt_base, int total, int nk,
                                             uint8_t* a_tiles, uint8_t* b_tiles, uint64_t* full, uint64_t* empty,
                                             int cw, int warp, int lane) {
  constexpr int kAcc = kTN / 2;
  const int wr = (warp % 4) * 16 + lane / 4, tq = lane % 4;
  uint32_t cnt = 0;
  for (int t = blockIdx.x; t < total; t += gridDim.x) {
    int e, m0, n0;
    TileAt<kTN>(mt_base, a.E, a.n_tiles, t, e, m0, n0);
    const int count = __ldcg(a.offsets + e + 1) - __ldcg(a.offsets + e);
    if (m0 + cw * 64 >= count) {  // none of this warpgroup's rows is the expert's: only free the slots
      for (int k = 0; k < nk; ++k, ++cnt) {
        const int s = cnt % kStages;
        MbarrierWait(&full[s], (cnt / kStages) & 1);
        MbarrierArrive(&empty[s]);
      }
      continue;
    }
    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
    for (int k = 0; k < nk; ++k, ++cnt) {
      const int s = cnt % kStages;
      MbarrierWait(&full[s], (cnt / kStages) & 1);
      const uint32_t a_addr = SharedAddr(a_tiles + s * kATileBytes) + cw * 64 * 128;
      const uint32_t b_addr = SharedAddr(b_tiles + s * kBTileBytes<kTN>);
      WgmmaFence();
#pragma unroll
      for (int ks = 0; ks < kTK / 16; ++ks) {
        if constexpr (kTN == 256) {
          WgmmaSS256(acc, WgmmaDesc(a_addr + ks * 32, 16, 1024), WgmmaDesc(b_addr + ks * 32, 16, 1024), 1);
        } else {
          WgmmaSS128(acc, WgmmaDesc(a_addr + ks * 32, 16, 1024), WgmmaDesc(b_addr + ks * 32, 16, 1024), 1);
        }
      }
      WgmmaCommit();
      WgmmaWait<1>();
      if (k > 0) MbarrierArrive(&empty[(cnt - 1) % kStages]);
    }
    WgmmaWait<0>();
    WgmmaPin(acc);
    MbarrierArrive(&empty[(cnt - 1) % kStages]);
    const int64_t row_base = __ldcg(a.offsets + e);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m0 + cw * 64 + wr + 8 * half;
      if (r >= count) continue;
      const int64_t row = row_base + r;
      if constexpr (kGateUp) {
        uint32_t* hrow = reinterpret_cast<uint32_t*>(a.h + row * a.inter + n0 / 2 + 2 * tq);
#pragma unroll
        for (int i = 0; i < kTN / 8; i += 2) {
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
        for (int i = 0; i < kTN / 8; ++i) {
          *reinterpret_cast<float2*>(yrow + 8 * i) = make_float2(acc[4 * i + 2 * half], acc[4 * i + 2 * half + 1]);
        }
      }
    }
  }
}
#endif

// 384 threads: warpgroup 0's thread 0 copies activation and (expanded) weight tiles by tensor
// map, warpgroups 1 and 2 multiply.
template <bool kGateUp, int kTN>
__global__ void __launch_bounds__(kThreads, 1)
    WgmmaGemmKernel(WgGemmArgs a, const __grid_constant__ CUtensorMap amap, const __grid_constant__ CUtensorMap bmap) {
#ifdef MOESHARD_MOE_WGMMA_DEVICE
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = SharedAddr(smem_raw);
  uint8_t* sm = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  uint8_t* a_tiles = sm;
  uint8_t* b_tiles = sm + kStages * kATileBytes;
  int32_t* mt_base = reinterpret_cast<int32_t*>(b_tiles + kStages * kBTileBytes<kTN>);  // [E + 1]
  __shared__ alignas(8) uint64_t full[kStages], empty[kStages];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wg = warp / 4;
  PdlWait();
  PdlTrigger();
  if (warp == 0) MoeTilePrefix(a.offsets, a.fast, a.E, kMoePathGemv, kTM, mt_base, lane);
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      MbarrierInit(&full[i], 1);
      MbarrierInit(&empty[i], 256);
    }
    FenceMbarrierInit();
  }
  __syncthreads();
  const int total = mt_base[a.E] * a.n_tiles;
  const int nk = a.K / kTK;
  if (wg == 0) {
    RegsDecrease<40>();
    if (tid == 0) {
      uint32_t cnt = 0;
      for (int t = blockIdx.x; t < total; t += gridDim.x) {
        int e, m0, n0;
        TileAt<kTN>(mt_base, a.E, a.n_tiles, t, e, m0, n0);
        const int arow = __ldcg(a.offsets + e) + m0, brow = e * a.n_tiles * kTN + n0;
        for (int k = 0; k < nk; ++k, ++cnt) {
          const int s = cnt % kStages;
          MbarrierWait(&empty[s], ((cnt / kStages) & 1) ^ 1);
          MbarrierArriveExpectTx(&full[s], kATileBytes + kBTileBytes<kTN>);
          TensorCopy2dToShared(a_tiles + s * kATileBytes, &amap, k * kTK, arow, &full[s]);
          TensorCopy2dToShared(b_tiles + s * kBTileBytes<kTN>, &bmap, k * kTK, brow, &full[s]);
        }
      }
    }
  } else {
    RegsIncrease<232>();
    ConsumeTiles<kGateUp, kTN>(a, mt_base, total, nk, a_tiles, b_tiles, full, empty, wg - 1, warp, lane);
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

// 32 values of one block of `w` (row, columns 32b..32b+31) as 16 bf16 pairs: BF16 copied, Q8_0
// and MXFP4 through the block decode of moe_block_decode.h from the 4-byte words that hold the
// block's bytes (loaded whole, aligned down; no word without a byte of the block is read).
__device__ __forceinline__ void DecodeStored(const WeightRef& w, int row, int b, uint32_t out[16]) {
  const uint8_t* r = w.data + static_cast<int64_t>(row) * w.row_stride_bytes;
  if (w.format == WeightFormat::kBF16) {
    const uint4* src = reinterpret_cast<const uint4*>(r + 2 * (w.col_offset + 32 * b));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = __ldg(src + i);
      out[4 * i] = v.x, out[4 * i + 1] = v.y, out[4 * i + 2] = v.z, out[4 * i + 3] = v.w;
    }
    return;
  }
  const int bytes = w.format == WeightFormat::kQ8_0 ? 34 : 17;
  const uint8_t* p = r + (w.col_offset / 32 + b) * bytes;
  const int off = static_cast<int>(reinterpret_cast<uintptr_t>(p) & 3), last = (off + bytes - 1) / 4;
  const uint32_t* a0 = reinterpret_cast<const uint32_t*>(p - off);
  uint32_t words[block_decode::kRawWords] = {};
#pragma unroll
  for (int i = 0; i < 10; ++i) {
    if (i <= last) words[i] = __ldg(a0 + i);
  }
  block_decode::DecodeBlock(w.format, words, off, out);
}

// The same from a view in the streaming layouts (MoeWork::wgmma_repacked: MXFP4 or Q8_0 repacked,
// whole matrices) or as stored.
__device__ __forceinline__ void DecodeWeights(const MoeWork& mw, const WeightRef& w, int row, int b, uint32_t out[16]) {
  if (mw.wgmma_repacked) {
    RepackedRowBlock(w.data, w.scale, w.cols, mw.stream_q8, row, b, out);
  } else {
    DecodeStored(w, row, b, out);
  }
}

// blockIdx.y = expert; each warp 32 consecutive 32-column blocks of the expert (gate, up, then
// down), one a lane. Where the warp's 32 outputs are one 2 KB run of the workspace (always but
// at a segment's or a gate/up row's edge when a row is not a multiple of 32 blocks), they go
// through shared memory so that each store instruction writes 512 contiguous bytes: 64-byte
// stores a lane (16 cache lines an instruction) held this pass to half the copy bandwidth.
__global__ void __launch_bounds__(256) ExpandKernel(const MoeExpertParams p, const MoeWork w) {
  __shared__ uint4 stage[8][32 * 4];
  PdlWait();
  PdlTrigger();
  const int e = blockIdx.y;
  if (w.fast[e] != kMoePathGemv || __ldcg(w.offsets + e + 1) == __ldcg(w.offsets + e)) return;
  // One expert's block counts fit 32 bits (3·I·L/32 < 2^31, WgmmaShape), so the index
  // arithmetic is 32-bit.
  const int L = static_cast<int>(p.width), I = static_cast<int>(p.inter), lb = L / 32, ib = I / 32;
  const int gu_blocks = I * lb, total = 2 * gu_blocks + L * ib;
  const MoeExpertWeights& ew = p.experts[e];
  uint16_t* gu = w.wexp + static_cast<int64_t>(e) * 2 * I * L;
  uint16_t* dn = w.wexp + static_cast<int64_t>(p.num_local_experts) * 2 * I * L + static_cast<int64_t>(e) * L * I;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint4* st = stage[warp];
  for (int base = blockIdx.x * blockDim.x + warp * 32; base < total; base += gridDim.x * blockDim.x) {
    const int i = base + lane;
    uint32_t out[16];
    uint16_t* dst = nullptr;
    if (i < total) {
      if (i < 2 * gu_blocks) {
        const bool up = i >= gu_blocks;
        const int j = up ? i - gu_blocks : i, row = j / lb, b = j - row * lb;
        const int dst_row = (row / 8) * 16 + (up ? 8 : 0) + row % 8;
        DecodeWeights(w, up ? ew.up : ew.gate, row, b, out);
        dst = gu + static_cast<int64_t>(dst_row) * L + 32 * b;
      } else {
        const int j = i - 2 * gu_blocks, row = j / ib, b = j - row * ib;
        DecodeWeights(w, ew.down, row, b, out);
        dst = dn + static_cast<int64_t>(row) * I + 32 * b;
      }
    }
    const uintptr_t d = reinterpret_cast<uintptr_t>(dst), d0 = __shfl_sync(~0u, d, 0);
    if (__all_sync(~0u, dst != nullptr && d == d0 + 64 * static_cast<uintptr_t>(lane))) {
      // Lane l's 16-byte part k at st[4l + (k ^ ((l >> 1) & 3))]: both the writes (eight lanes'
      // 64-byte strides) and the reads (eight consecutive parts) touch each bank once a phase.
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        st[4 * lane + (k ^ ((lane >> 1) & 3))] = make_uint4(out[4 * k], out[4 * k + 1], out[4 * k + 2], out[4 * k + 3]);
      }
      __syncwarp();
      uint4* g = reinterpret_cast<uint4*>(d0);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int c = lane + 32 * m, blk = c / 4;
        g[c] = st[4 * blk + ((c % 4) ^ ((blk >> 1) & 3))];
      }
      __syncwarp();
    } else if (dst != nullptr) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        reinterpret_cast<uint4*>(dst)[k] = make_uint4(out[4 * k], out[4 * k + 1], out[4 * k + 2], out[4 * k + 3]);
      }
    }
  }
}

template <bool kGateUp, int kTN>
cudaError_t LaunchGemmAs(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  const int E = p.num_local_experts;
  const int64_t L = p.width, I = p.inter, K = kGateUp ? L : I, n_rows = kGateUp ? 2 * I : L;
  CUtensorMap amap, bmap;
  const void* act = kGateUp ? static_cast<const void*>(w.y) : w.h;  // gate/up: the gathered x in y
  if (cudaError_t err = EncodeBf16Map128B(act, w.capacity, K, kTM, &amap); err != cudaSuccess) return err;
  const uint16_t* wts = kGateUp ? w.wexp : w.wexp + static_cast<int64_t>(E) * 2 * I * L;
  if (cudaError_t err = EncodeBf16Map128B(wts, E * n_rows, K, kTN, &bmap); err != cudaSuccess) return err;
  WgGemmArgs a{w.offsets, w.fast, E, static_cast<int>(K), static_cast<int>(n_rows / kTN), static_cast<uint16_t*>(w.h),
               I,         w.y,    L};
  const size_t smem = GemmSmemBytes<kTN>(E);
  static std::atomic<size_t> smem_set{0};
  if (smem_set.load(std::memory_order_relaxed) < smem) {
    const size_t most = GemmSmemBytes<kTN>(kMoeWgmmaMaxExperts);
    if (cudaError_t err = cudaFuncSetAttribute(WgmmaGemmKernel<kGateUp, kTN>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(most));
        err != cudaSuccess) {
      return err;
    }
    smem_set.store(most, std::memory_order_relaxed);
  }
  // Tiles: at most capacity / kTM + E m-tiles (each expert's last one partial) times n_tiles.
  const int64_t most_tiles = (w.capacity / kTM + E) * (n_rows / kTN);
  const unsigned grid = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(most_tiles, w.num_sms)));
  return LaunchPdl(WgmmaGemmKernel<kGateUp, kTN>, grid, kThreads, smem, stream, a, amap, bmap);
}

template <bool kGateUp>
cudaError_t LaunchGemm(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return WideTiles(p.width, p.inter) ? LaunchGemmAs<kGateUp, 256>(p, w, stream)
                                     : LaunchGemmAs<kGateUp, 128>(p, w, stream);
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
  if (cudaError_t err = LaunchPdl(ExpandKernel, egrid, 256, 0, stream, p, w); err != cudaSuccess) return err;
  return LaunchGemm<true>(p, w, stream);
}

cudaError_t LaunchMoeWgmmaDown(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return LaunchGemm<false>(p, w, stream);
}

}  // namespace moeshard::gpu
