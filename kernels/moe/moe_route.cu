// Grouping, gathering and combining kernels of the MoE expert step.
//
// Route (one block per local expert e): every block reads all T·top_k expert ids twice.
// First it builds the histogram of all experts in shared memory (integer atomics: the counts
// do not depend on their order), which gives its own rows' offset without any inter-block
// dependency, and checks every expert's views (one thread each) for the tensor-core path.
// Then it compacts the pairs that chose e, chunk by chunk in pair order (each thread a run
// of 16 pairs, a block scan of the runs' counts): the grouped order is deterministic.
// Block 0 also writes the offsets and the tensor-core path's tile prefix, and marks pairs
// whose expert is not local.
//
// GatherX copies each row's token of x into xg as bf16 in the permuted layout of
// moe_device.cuh MoePermCol, so that one 16-byte load gives the tensor-core path its B
// fragments for two k-steps.
//
// Combine (one block per token) walks the token's slots in order: per slot the expert's
// output row into registers, an optional block-reduced RMS norm (all slots' sums of squares
// first, in one pass), then acc += weight · row. Tokens with no
// local expert get zeros. No atomics: the result is the same bit for bit on every run.
#include "kernels/moe/moe_device.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/moe/moe_launch.h"

namespace moeshard::gpu {
namespace {

constexpr int kRouteThreads = 512;
constexpr int kRun = 16;  // pairs per thread per chunk of the compaction
constexpr int kCombineThreads = 256;
constexpr int kMaxTopK = 64;  // MoeExpertStep rejects more

// An expert's path once its rows are counted: with MoeWork::stream_split, a repacked expert with at
// least sw_min_rows rows goes to the wgmma GEMMs over decoded registers (no streaming tiles).
__device__ __forceinline__ int PathOf(int flag, int32_t rows, int32_t sw_min_rows) {
  return flag == kMoePathNvfp4 && sw_min_rows > 0 && rows >= sw_min_rows ? int{kMoePathSw} : flag;
}

__global__ void __launch_bounds__(kRouteThreads) RouteKernel(MoeExpertParams p, MoeWork w) {
  extern __shared__ int32_t hist[];  // [E] counts, then [E] fast flags
  int32_t* fast_flag = hist + p.num_local_experts;
  __shared__ int32_t warp_off[kRouteThreads / 32];
  __shared__ int32_t chunk_total, my_offset;
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
  // kRun independent loads per thread before the atomics: the loop is latency-bound otherwise.
  for (int64_t c0 = 0; c0 < num_pairs; c0 += int64_t{kRouteThreads} * kRun) {
    int32_t ids[kRun];
#pragma unroll
    for (int j = 0; j < kRun; ++j) {
      const int64_t i = c0 + j * kRouteThreads + tid;
      ids[j] = i < num_pairs ? p.expert_ids[i] : -1;
    }
#pragma unroll
    for (int j = 0; j < kRun; ++j) {
      if (ids[j] >= 0 && ids[j] < E) atomicAdd(&hist[ids[j]], 1);
    }
  }
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
  // Ordered compaction: chunks of kRouteThreads · kRun pairs; thread tid owns the run of
  // kRun pairs at tid · kRun, so a block-wide exclusive scan of the runs' counts keeps order.
  int32_t base = my_offset;
  for (int64_t c0 = 0; c0 < num_pairs; c0 += int64_t{kRouteThreads} * kRun) {
    const int64_t r0 = c0 + int64_t{tid} * kRun;
    int32_t ids[kRun];
    int n = 0;
#pragma unroll
    for (int j = 0; j < kRun; ++j) {
      ids[j] = r0 + j < num_pairs ? p.expert_ids[r0 + j] : -1;
      n += ids[j] == e;
      if (e == 0 && r0 + j < num_pairs && (ids[j] < 0 || ids[j] >= E)) w.pos[r0 + j] = -1;
    }
    int incl = n;
    for (int d = 1; d < 32; d <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += u;
    }
    if (lane == 31) warp_off[warp] = incl;
    __syncthreads();
    if (warp == 0) {
      const int v = lane < kRouteThreads / 32 ? warp_off[lane] : 0;
      int wi = v;
      for (int d = 1; d < 32; d <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, wi, d);
        if (lane >= d) wi += u;
      }
      if (lane < kRouteThreads / 32) warp_off[lane] = wi - v;
      if (lane == 31) chunk_total = wi;
    }
    __syncthreads();
    int32_t r = base + warp_off[warp] + incl - n;
#pragma unroll
    for (int j = 0; j < kRun; ++j) {
      if (ids[j] == e) {
        w.rows[r] = static_cast<int32_t>(r0 + j);
        w.pos[r0 + j] = r;
        ++r;
      }
    }
    base += chunk_total;
    __syncthreads();
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
      if (i < L / 4) reinterpret_cast<float4*>(o)[i] = acc[v];
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
  }
}

}  // namespace

cudaError_t LaunchMoeRoute(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  const size_t smem = sizeof(int32_t) * 2 * p.num_local_experts;
  return LaunchPdl(RouteKernel, p.num_local_experts, kRouteThreads, smem, stream, p, w);
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
