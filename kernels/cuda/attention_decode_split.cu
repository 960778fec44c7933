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
//     exactly 1 otherwise).
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
  static constexpr int kMerge = kWarps * kRows * HD * 4 + 2 * kWarps * kRows * 4;
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

template <int HD, KvElem E>
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
  const int64_t kb = split.kb, ke = split.ke;
  const int32_t* table = p.block_tables + p.table_offset[t];
  if (kb < ke) {
    for (int64_t b = kb / bs + tid; b <= (ke - 1) / bs; b += kThreads) PrefetchL1(table + b);
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
  const int64_t k0 = (kb & ~int64_t{15}) + kKeys * warp;
  const int nc = k0 < ke ? static_cast<int>((ke - k0 + kStride - 1) / kStride) : 0;
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
  // Group c into ring slot `slot`: lane 0 the K and V boxes (16 consecutive slots of a block,
  // one KV head); FP8: lane r < 16 key r's K scale, 16 + r its V scale (zero past the keys).
  auto issue = [&](int c, int slot) {
    uint8_t* st = ring + slot * G::kStage;
    const int64_t c0 = k0 + static_cast<int64_t>(c) * kStride;
    int slot0 = 0;
    if (lane == 0) {
      const int b = static_cast<int>(c0) / bs;
      slot0 = table[b] * bs + (static_cast<int>(c0) - b * bs);
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
      slot0 = __shfl_sync(0xffffffffu, slot0, 0);
      const int64_t kp = c0 + r;
      float* sc = reinterpret_cast<float*>(scl + slot * G::kScales) + (lane >= 16 ? kKeys : 0) + r;
      CpAsync4(sc, scales + (static_cast<int64_t>(slot0) + r) * nkv + g, kp >= kb && kp < ke);
      MbarrierArriveOnCpAsync(full + slot);
    }
  };
  for (int c = 0; c < S && c < nc; ++c) issue(c, c);

  // Q rows (the group's heads), zero past the group; fp16 for an FP8 cache.
  const uint16_t* q = static_cast<const uint16_t*>(p.q) + t * (p.q_stride ? p.q_stride : H * HD) + g * group * HD;
  for (int i = tid; i < kRows * HD; i += kThreads) {
    const int row = i / HD, d = i % HD;
    uint16_t v = row < group ? q[row * HD + d] : uint16_t{0};
    if constexpr (F16) {
      const __half h = __float2half_rn(DevBf16ToF32(v));
      v = *reinterpret_cast<const uint16_t*>(&h);
    }
    Qs[row * LD + d] = v;
  }
  __syncthreads();
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
    MbarrierWait(full + slot, static_cast<uint32_t>((c / S) & 1));
    uint8_t* st = ring + slot * G::kStage;
    const uint8_t* kst = st;
    uint8_t* vst = st + G::kTile;
    const float* kscale = reinterpret_cast<const float*>(scl + slot * G::kScales);
    const float* vscale = kscale + kKeys;
    const int64_t c0 = k0 + static_cast<int64_t>(c) * kStride;
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
        for (int ks = 0; ks < KS; ++ks) Mma<true>(s[n], qa[ks], E4m3x2ToF16x2(w[ks]), E4m3x2ToF16x2(w[ks] >> 16));
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
    float mx[2];
    ScaleMaskScores<F16>(s, c0 + 2 * cq, kb, ke, p.scale, kscale, lane, mx);
    float m_new[2], m_use[2];
    bool grew = false;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      m_new[i] = fmaxf(m[i], QuadMax(mx[i]));
      grew |= m_new[i] != m[i];
      m_use[i] = m_new[i] == -INFINITY ? 0.f : m_new[i];
    }
    // A row whose max did not grow has the factor expf(0) = 1: skipping it changes nothing.
    if (__any_sync(0xffffffffu, grew)) {
      float corr[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        corr[i] = expf(m[i] - m_use[i]);
        l[i] *= corr[i];
      }
      RescaleO<HD>(o, corr);
    }
    m[0] = m_new[0];
    m[1] = m_new[1];
    float sum[2];
    uint32_t pa[4];
    ScoresToP<F16>(s, m_use, vscale, lane, sum, pa);  // F16: P times V's scale (the sum is the unscaled one)
    l[0] += sum[0];
    l[1] += sum[1];
    // Keys outside [kb, ke): their V rows zeroed (P is 0 there, and 0 times a NaN such a row may
    // hold would not be).
    if (edge) {
      for (int i = lane; i < kKeys * (G::kRowBytes / 16); i += 32) {
        const int row = i / (G::kRowBytes / 16), piece = i % (G::kRowBytes / 16);
        if (c0 + row < kb || c0 + row >= ke) {
          *reinterpret_cast<uint4*>(vst + TileOffset<HD, E>(row, piece)) = make_uint4(0, 0, 0, 0);
        }
      }
      __syncwarp();
    }
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
          Mma<true>(o[4 * q + 2 * h], pa, E4m3x2ToF16x2(x0), E4m3x2ToF16x2(x1));
          Mma<true>(o[4 * q + 2 * h + 1], pa, E4m3x2ToF16x2(x0 >> 16), E4m3x2ToF16x2(x1 >> 16));
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
      issue(c + S, slot);
    }
  }
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

template <int HD, KvElem E>
cudaError_t Prepare(std::atomic<uint64_t>& smem_set) {
  return EnsureDynamicSmem(&DecodeSplitKernel<HD, E>, Geo<HD, E>::kSmem, smem_set);
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

template <int HD, KvElem E>
cudaError_t LaunchHd(const AttentionParams& p, int splits, cudaStream_t st) {
  static std::atomic<uint64_t> smem_set{0};
  if (cudaError_t e = Prepare<HD, E>(smem_set); e != cudaSuccess) return e;
  CUtensorMap kmap, vmap;  // host encoding only (microseconds): the launch (or graph node) copies them
  if (cudaError_t e = EncodeKvMap<HD, E>(p.cache.k, p.cache, &kmap); e != cudaSuccess) return e;
  if (cudaError_t e = EncodeKvMap<HD, E>(p.cache.v, p.cache, &vmap); e != cudaSuccess) return e;
  const int group = static_cast<int>(p.num_heads / p.cache.num_kv_heads);
  float* ws = splits > 1 ? static_cast<float*>(p.workspace) : nullptr;
  dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(p.cache.num_kv_heads),
            static_cast<unsigned>(p.num_tokens));
  return LaunchPdl(&DecodeSplitKernel<HD, E>, grid, kThreads, Geo<HD, E>::kSmem, st, p, group, splits, ws, kmap, vmap);
}

template <int HD, KvElem E>
cudaError_t Occupancy(int* n) {
  static std::atomic<uint64_t> smem_set{0};
  if (cudaError_t e = Prepare<HD, E>(smem_set); e != cudaSuccess) return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, &DecodeSplitKernel<HD, E>, kThreads, Geo<HD, E>::kSmem);
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
  const bool fp8 = p.cache.elem == KvElem::kFp8E4M3;
  if (p.cache.head_dim == 64)
    return fp8 ? LaunchHd<64, KvElem::kFp8E4M3>(p, s, st) : LaunchHd<64, KvElem::kBF16>(p, s, st);
  return fp8 ? LaunchHd<128, KvElem::kFp8E4M3>(p, s, st) : LaunchHd<128, KvElem::kBF16>(p, s, st);
}

}  // namespace moeshard::gpu
