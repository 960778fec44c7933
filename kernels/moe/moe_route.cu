// Grouping, gathering and combining kernels of the MoE expert step.
//
// Route (one block per local expert e): every block reads all T·top_k expert ids twice, each
// warp a contiguous segment of them, four consecutive pairs a lane (one 16-byte load where the
// ids are 16-byte aligned). First it builds the histogram of all experts in shared memory
// (integer atomics: the counts do not depend on their order), which gives its own rows' offset
// without any inter-block dependency, counts each warp's pairs that chose e, and checks every
// expert's views (one thread each) for the tensor-core path. Then each warp compacts its
// segment's pairs that chose e in pair order, 128 at a time by three ballots, from its place
// after the warps before it: the grouped order is deterministic, and the block meets the same
// three barriers whatever T is (a block-wide scan every 8,192 pairs, each thread's 16 pairs read
// 64 bytes apart, took 65 µs at 65,536 pairs on an H100; this form 23 µs).
// Block 0 also writes the offsets and the tensor-core path's tile prefix; each block marks, in
// its E-th of the pairs, those whose expert is not local.
//
// GatherX copies each row's token of x into xg as bf16 in the permuted layout of
// moe_device.cuh MoePermCol, so that one 16-byte load gives the tensor-core path its B
// fragments for two k-steps.
//
// Combine (one block per token) walks the token's slots in order: per slot the expert's
// output row into registers, an optional block-reduced RMS norm (all slots' sums of squares
// first, in one pass), then acc += weight · row. Tokens with no
// local expert get zeros. No atomics: the result is the same bit for bit on every run. With
// MoeExpertParams::out_act it also writes the mix's bf16 copy (round to nearest even).
#include "kernels/cuda/act.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/moe/moe_device.cuh"
#include "kernels/moe/moe_launch.h"

namespace moeshard::gpu {
namespace {

constexpr int kRouteThreads = 512;
constexpr int kRouteWarps = kRouteThreads / 32;
constexpr int kRun = 8;  // a lane's loads in flight (four consecutive pairs each, 128 a warp's load)
constexpr int kCombineThreads = 256;
constexpr int kMaxTopK = 64;  // MoeExpertStep rejects more

// An expert's path once its rows are counted: with MoeWork::stream_split, a repacked expert with at
// least sw_min_rows rows goes to the wgmma GEMMs over decoded registers (no streaming tiles).
__device__ __forceinline__ int PathOf(int flag, int32_t rows, int32_t sw_min_rows) {
  return flag == kMoePathNvfp4 && sw_min_rows > 0 && rows >= sw_min_rows ? int{kMoePathSw} : flag;
}

// Pairs i0 .. i0 + 3 of a segment ending at s1 (past it: -1); kVec: the ids 16-byte aligned and
// i0 a multiple of 4, one load where all four are in the segment.
template <bool kVec>
__device__ __forceinline__ void LoadIds4(const int32_t* ids, int64_t i0, int64_t s1, int32_t out[4]) {
  if (kVec && i0 + 3 < s1) {
    const int4 v = *reinterpret_cast<const int4*>(ids + i0);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
    return;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) out[k] = i0 + k < s1 ? ids[i0 + k] : -1;
}

template <bool kVec>
__global__ void __launch_bounds__(kRouteThreads) RouteKernel(MoeExpertParams p, MoeWork w) {
  extern __shared__ int32_t hist[];  // [E] counts, then [E] fast flags
  int32_t* fast_flag = hist + p.num_local_experts;
  __shared__ int32_t warp_off[kRouteWarps];
  __shared__ int32_t my_offset;
  const int E = p.num_local_experts, e = blockIdx.x, tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int64_t num_pairs = p.num_tokens * p.top_k;
  for (int i = tid; i < E; i += blockDim.x) hist[i] = 0;
  // Which experts the tensor-core path takes: one thread per expert (their weight views are
  // read in parallel). The views are fixed, so this runs before PdlWait (pdl.cuh), beside the
  // kernel before.
  const bool any_fast = w.fast_allowed || w.gemv_allowed;
  for (int i = tid; i < E; i += blockDim.x) {
    const MoeExpertWeights ew = any_fast ? p.experts[i] : MoeExpertWeights{};  // one round trip
    int flag = kMoePathGeneric;
    if (w.fast_allowed && FastEligible(ew, p.width, p.inter)) {
      flag = w.wgmma_repacked ? kMoePathGemv : kMoePathNvfp4;  // repacked experts to the wgmma GEMMs
    } else if (w.gemv_allowed && MoeGemvEligible(ew, p.width, p.inter)) {
      flag = kMoePathGemv;
    }
    fast_flag[i] = flag;
  }
  PdlWait();
  PdlTrigger();
  if (e == 0) {  // the streaming kernels' fix-up counters (each last arrival resets its own too)
    for (int i = tid; i < kMoeFixBlocks; i += blockDim.x) w.fix_count[i] = 0;
  }
  __syncthreads();
  // The warp's segment of pairs [s0, s1): whole 128-pair loads, in warp order.
  const int64_t seg = ((num_pairs + kRouteWarps - 1) / kRouteWarps + 127) / 128 * 128;
  const int64_t s0 = warp * seg < num_pairs ? warp * seg : num_pairs, s1 = s0 + seg < num_pairs ? s0 + seg : num_pairs;
  // kRun independent loads per lane before the atomics: the loop is latency-bound otherwise.
  // Pairs whose expert is on another GPU get no row here (the combine skips them): each block marks
  // those of its E-th of the pairs [m0, m1) (block 0 marking all of them took longer than the rest).
  const int64_t share = (num_pairs + E - 1) / E, m0 = e * share, m1 = m0 + share;
  int32_t mine = 0;
  for (int64_t c0 = s0; c0 < s1; c0 += 128 * kRun) {
    int32_t ids[kRun][4];
#pragma unroll
    for (int j = 0; j < kRun; ++j) LoadIds4<kVec>(p.expert_ids, c0 + (j * 32 + lane) * 4, s1, ids[j]);
#pragma unroll
    for (int j = 0; j < kRun; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t i = c0 + (j * 32 + lane) * 4 + k;
        if (ids[j][k] >= 0 && ids[j][k] < E) {
          atomicAdd(&hist[ids[j][k]], 1);
        } else if (i >= m0 && i < m1 && i < s1) {
          w.pos[i] = -1;
        }
        mine += ids[j][k] == e;
      }
  }
  for (int d = 16; d > 0; d >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, d);
  if (lane == 0) warp_off[warp] = mine;
  __syncthreads();
  if (warp == 0) {  // block 0's warp 0 also writes the offsets and the tile prefix  // integer sums: any order gives the same result
    if (lane == 0) w.fast[e] = static_cast<uint8_t>(PathOf(fast_flag[e], hist[e], w.sw_min_rows));
    if (e == 0 && lane < 2 && w.sw_next != nullptr) w.sw_next[lane] = 0;  // the pair step's item counters
    int32_t part = 0;
    for (int i = lane; i < e; i += 32) part += hist[i];
    for (int d = 16; d > 0; d >>= 1) part += __shfl_xor_sync(0xffffffffu, part, d);
    if (lane == 0) my_offset = part;
    if (e == 0) {  // exclusive scans of the counts, the NVFP4 tiles and the GEMV groups
      int32_t o = 0, tiles = 0, groups = 0;
      for (int i0 = 0; i0 < E; i0 += 32) {
        const int i = i0 + lane;
        const int32_t h = i < E ? hist[i] : 0;
        const int flag = i < E ? PathOf(fast_flag[i], h, w.sw_min_rows) : 0;
        const int32_t nt = flag == kMoePathNvfp4 ? (h + kMoeTileTokens - 1) / kMoeTileTokens : 0;
        const int32_t ng = flag == kMoePathGemv ? (h + kMoeGemvTokens - 1) / kMoeGemvTokens : 0;
        int32_t sh = h, st = nt, sg = ng;
        for (int d = 1; d < 32; d <<= 1) {
          const int32_t uh = __shfl_up_sync(0xffffffffu, sh, d), ut = __shfl_up_sync(0xffffffffu, st, d),
                        ug = __shfl_up_sync(0xffffffffu, sg, d);
          if (lane >= d) sh += uh, st += ut, sg += ug;
        }
        if (i < E) {
          w.offsets[i] = o + sh - h;
          w.tile_base[i] = tiles + st - nt;
          w.gemv_base[i] = groups + sg - ng;
        }
        o += __shfl_sync(0xffffffffu, sh, 31);
        tiles += __shfl_sync(0xffffffffu, st, 31);
        groups += __shfl_sync(0xffffffffu, sg, 31);
      }
      if (lane == 0) {
        w.offsets[E] = o;
        w.tile_base[E] = tiles;
        w.gemv_base[E] = groups;
      }
    }
  }
  __syncthreads();
  // Ordered compaction: each warp its segment, after the segments before it (the warps' counts
  // summed in order), 128 pairs at a time: a lane's hits (0-4) summed over the lanes below it from
  // three ballots of the count's bits.
  int32_t r = my_offset;
  for (int i = 0; i < warp; ++i) r += warp_off[i];
  const uint32_t below = (1u << lane) - 1u;
  for (int64_t c0 = s0; c0 < s1; c0 += 128 * kRun) {
    int32_t ids[kRun][4];
#pragma unroll
    for (int j = 0; j < kRun; ++j) LoadIds4<kVec>(p.expert_ids, c0 + (j * 32 + lane) * 4, s1, ids[j]);
#pragma unroll
    for (int j = 0; j < kRun; ++j) {
      const int64_t i0 = c0 + (j * 32 + lane) * 4;
      const int n = (ids[j][0] == e) + (ids[j][1] == e) + (ids[j][2] == e) + (ids[j][3] == e);
      const uint32_t b0 = __ballot_sync(0xffffffffu, n & 1), b1 = __ballot_sync(0xffffffffu, n & 2),
                     b2 = __ballot_sync(0xffffffffu, n & 4);
      int32_t rr = r + __popc(b0 & below) + 2 * __popc(b1 & below) + 4 * __popc(b2 & below);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (ids[j][k] == e) {
          w.rows[rr] = static_cast<int32_t>(i0 + k);
          w.pos[i0 + k] = rr;
          ++rr;
        }
      }
      r += __popc(b0) + 2 * __popc(b1) + 4 * __popc(b2);
    }
  }
}

__global__ void GatherXKernel(const uint16_t* x, int64_t L, int top_k, MoeWork w, int E) {
  PdlWait();
  PdlTrigger();
  const int32_t total = w.offsets[E];
  const int64_t groups = L / 8;
  for (int32_t r = blockIdx.x; r < total; r += gridDim.x) {
    const int64_t t = w.rows[r] / top_k;
    const uint4* src = reinterpret_cast<const uint4*>(x + t * L);
    uint4* dst = reinterpret_cast<uint4*>(w.xg + static_cast<int64_t>(r) * L);
    for (int64_t gi = threadIdx.x; gi < groups; gi += blockDim.x) {
      uint4 v = src[gi], o;
      o.x = __byte_perm(v.x, v.z, 0x5410);  // (e0, e4)
      o.y = __byte_perm(v.x, v.z, 0x7632);  // (e1, e5)
      o.z = __byte_perm(v.y, v.w, 0x5410);  // (e2, e6)
      o.w = __byte_perm(v.y, v.w, 0x7632);  // (e3, e7)
      dst[MoePermCol(gi * 8) / 8] = o;
    }
  }
}

__device__ float BlockSum(float v, float* red) {
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // `red` may still be read from the previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.f;
  for (int i = 0; i < static_cast<int>(blockDim.x / 32); ++i) s += red[i];
  return s;
}

// Per thread, kVec float4 of the row in registers (L ≤ kCombineThreads · 4 · kVec); wider
// rows take the plain loop.
template <int kVec>
__global__ void __launch_bounds__(kCombineThreads) CombineKernel(MoeExpertParams p, MoeWork w) {
  __shared__ float red[kCombineThreads / 32];
  __shared__ int32_t slot_row[kMaxTopK];
  __shared__ float slot_w[kMaxTopK];
  __shared__ float slot_ss[kVec > 0 ? kMaxTopK : 1][kCombineThreads / 32];  // per slot, per warp
  PdlWait();
  PdlTrigger();
  const int64_t t = blockIdx.x, L = p.width;
  const int tid = threadIdx.x;
  if (tid < p.top_k) {
    slot_row[tid] = w.pos[t * p.top_k + tid];
    slot_w[tid] = p.weights[t * p.top_k + tid];
  }
  __syncthreads();
  float* o = p.out + t * L;
  if constexpr (kVec > 0) {
    // Pass 1 (norm only): every slot's sum of squares, reduced as BlockSum does (lanes by
    // xor shuffles, then warps in order), with the slots' loads in flight together rather
    // than one slot's round trip and barrier after another.
    if (p.output_norm) {
#pragma unroll 4
      for (int k = 0; k < p.top_k; ++k) {
        const int32_t r = slot_row[k];
        if (r < 0) continue;
        const float4* yr = reinterpret_cast<const float4*>(w.y + static_cast<int64_t>(r) * L);
        float ss = 0.f;
#pragma unroll
        for (int v = 0; v < kVec; ++v) {
          const int64_t i = tid + int64_t{v} * kCombineThreads;
          const float4 y = i < L / 4 ? yr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
          ss += y.x * y.x + y.y * y.y + y.z * y.z + y.w * y.w;
        }
        for (int d = 16; d > 0; d >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, d);
        if ((tid & 31) == 0) slot_ss[k][tid >> 5] = ss;
      }
      __syncthreads();
    }
    float4 acc[kVec];
#pragma unroll
    for (int v = 0; v < kVec; ++v) acc[v] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (int k = 0; k < p.top_k; ++k) {
      const int32_t r = slot_row[k];
      if (r < 0) continue;
      const float4* yr = reinterpret_cast<const float4*>(w.y + static_cast<int64_t>(r) * L);
      float4 y[kVec];
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const int64_t i = tid + int64_t{v} * kCombineThreads;
        y[v] = i < L / 4 ? yr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
      }
      float inv = 1.f;
      if (p.output_norm) {
        float sum = 0.f;
        for (int i = 0; i < kCombineThreads / 32; ++i) sum += slot_ss[k][i];
        inv = 1.f / sqrtf(sum / static_cast<float>(L) + p.eps);
      }
      const float wt = slot_w[k];
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        acc[v].x += wt * (y[v].x * inv);
        acc[v].y += wt * (y[v].y * inv);
        acc[v].z += wt * (y[v].z * inv);
        acc[v].w += wt * (y[v].w * inv);
      }
    }
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      const int64_t i = tid + int64_t{v} * kCombineThreads;
      if (i < L / 4) {
        reinterpret_cast<float4*>(o)[i] = acc[v];
        if (p.out_act) reinterpret_cast<uint2*>(static_cast<uint16_t*>(p.out_act) + t * L)[i] = PackBf16x4(acc[v]);
      }
    }
  } else {
    bool first = true;
    for (int k = 0; k < p.top_k; ++k) {
      const int32_t r = slot_row[k];
      if (r < 0) continue;
      const float* yr = w.y + static_cast<int64_t>(r) * L;
      float inv = 1.f;
      if (p.output_norm) {
        float ss = 0.f;
        for (int64_t i = tid; i < L; i += blockDim.x) ss = fmaf(yr[i], yr[i], ss);
        inv = 1.f / sqrtf(BlockSum(ss, red) / static_cast<float>(L) + p.eps);
      }
      const float wt = slot_w[k];
      for (int64_t i = tid; i < L; i += blockDim.x) {
        const float v = wt * (yr[i] * inv);
        o[i] = first ? v : o[i] + v;
      }
      first = false;
    }
    if (first) {
      for (int64_t i = tid; i < L; i += blockDim.x) o[i] = 0.f;
    }
    if (p.out_act) {  // each thread reads back only the elements it wrote
      for (int64_t i = tid; i < L; i += blockDim.x) static_cast<uint16_t*>(p.out_act)[t * L + i] = DevF32ToBf16(o[i]);
    }
  }
}

}  // namespace

cudaError_t LaunchMoeRoute(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  const size_t smem = sizeof(int32_t) * 2 * p.num_local_experts;
  if (reinterpret_cast<uintptr_t>(p.expert_ids) % 16 == 0) {
    return LaunchPdl(RouteKernel<true>, p.num_local_experts, kRouteThreads, smem, stream, p, w);
  }
  return LaunchPdl(RouteKernel<false>, p.num_local_experts, kRouteThreads, smem, stream, p, w);
}

cudaError_t LaunchMoeGatherX(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  const int64_t blocks = std::min<int64_t>(w.capacity, int64_t{8} * w.num_sms);
  return LaunchPdl(GatherXKernel, static_cast<unsigned>(blocks), 128, 0, stream, static_cast<const uint16_t*>(p.x),
                   p.width, p.top_k, w, p.num_local_experts);
}

cudaError_t LaunchMoeCombine(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(p.num_tokens);
  const int64_t vec = (p.width / 4 + kCombineThreads - 1) / kCombineThreads;
  auto* k = p.width % 4 != 0 || vec > 8 ? &CombineKernel<0>
            : vec <= 1                    ? &CombineKernel<1>
            : vec <= 4                    ? &CombineKernel<4>
                                          : &CombineKernel<8>;
  return LaunchPdl(k, grid, kCombineThreads, 0, stream, p, w);
}

}  // namespace moeshard::gpu
