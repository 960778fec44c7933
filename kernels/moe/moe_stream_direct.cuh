// What the two forms of the direct decode GEMV over repacked experts share (moe_stream_direct.cu:
// a block a unit, its warps splitting K in quarters; moe_stream_direct_warp.cu: a warp a unit,
// the whole of K, the quarters' sums kept apart and added in the same order, so both forms give
// the same bits): a chunk's geometry, the experts' views, the pairs' table, a chunk's bulk copies
// and its arithmetic. A chunk is 256 columns of a 16-row slice: its code bytes (e2m1 for NVFP4 /
// MXFP4, int8 for Q8_0's layout) and its 256 scale bytes, one bulk copy each.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/moe/moe_device.cuh"
#include "kernels/moe/moe_launch.h"
#include "kernels/moe/moe_q8_stream_layout.h"

namespace moeshard::gpu::stream_direct {

constexpr int kScale = 256, kCols = 256;  // one chunk of a 16-row slice: its scale bytes, columns
template <bool kQ8>
constexpr int kData = kQ8 ? kQ8StreamSliceBytes : 2048;
template <bool kQ8>
constexpr int kStage = kData<kQ8> + kScale;

// A warp's own ring of bulk-copy stages (the warp form, moe_stream_direct_warp.cu, and down with the
// residual update, moe_stream_direct_res.cu): e2m1's 2,304-byte stages four deep, Q8_0's 4,352-byte
// ones three. A block of W warps holds the rings, then the rings' mbarriers (8 bytes a stage), then
// its own arrays from RingsEnd.
template <bool kQ8>
constexpr int kRingSlots = kQ8 ? 3 : 4;
template <bool kQ8>
constexpr int RingBarOffset(int warps) {
  return warps * kRingSlots<kQ8> * kStage<kQ8>;
}
template <bool kQ8>
constexpr int RingsEnd(int warps) {
  return RingBarOffset<kQ8>(warps) + warps * kRingSlots<kQ8> * 8;
}

// One expert's two views of this launch (gate and up; down twice), repacked and dense.
struct Views {
  const uint8_t* data[2];
  const uint8_t* scale[2];
  int64_t chunks[2];  // 256-column chunks a 16-row slice
  float fin[2];       // what the sums are multiplied by: scale2 · 2^8
};

// The views, then the pairs' expert ids, the local pairs' indices (UnitCursor) and their count.
__host__ __device__ constexpr int TableBytes(int E, int64_t pairs) {
  return static_cast<int>(E * sizeof(Views) + 8 * pairs + 4);
}

// The experts' views into `tab` by the block's kThreads threads: fixed weights, read before the
// wait (pdl.cuh rule 1).
template <bool kGateUp, int kThreads>
__device__ __forceinline__ void LoadViews(const MoeExpertParams& p, Views* tab) {
  for (int i = threadIdx.x; i < p.num_local_experts; i += kThreads) {
    const MoeExpertWeights& ew = p.experts[i];
    const WeightRef& v0 = kGateUp ? ew.gate : ew.down;
    const WeightRef& v1 = kGateUp ? ew.up : ew.down;
    tab[i] = Views{{v0.data, v1.data},
                   {v0.scale, v1.scale},
                   {v0.cols / kCols, v1.cols / kCols},
                   {v0.scale2 * 256.f, v1.scale2 * 256.f}};
  }
}

// The step's expert ids into `ids` and the local pairs' indices, in order, into `local` (their
// count at local[pairs]); gate/up also writes the combine's pos (the pair, or -1: another GPU's
// expert). Every thread of the block (kThreads) calls it; block barriers inside.
template <bool kGateUp, int kThreads>
__device__ __forceinline__ void LoadIds(const MoeExpertParams& p, const MoeWork& w, int32_t* ids, int32_t* local) {
  const int64_t pairs = p.num_tokens * p.top_k;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int64_t i = threadIdx.x; i < pairs; i += kThreads) ids[i] = __ldcg(p.expert_ids + i);
  __syncthreads();
  if (warp == 0) {
    int n = 0;
    for (int64_t b = 0; b < pairs; b += 32) {
      const bool here = b + lane < pairs && ids[b + lane] >= 0;
      const uint32_t m = __ballot_sync(~0u, here);
      if (here) local[n + __popc(m & ((1u << lane) - 1u))] = static_cast<int32_t>(b + lane);
      n += __popc(m);
    }
    if (lane == 0) local[pairs] = n;
  }
  __syncthreads();
  if constexpr (kGateUp) {
    for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < pairs; i += int64_t{gridDim.x} * kThreads) {
      w.pos[i] = ids[i] >= 0 ? static_cast<int32_t>(i) : -1;
    }
  }
}

// Grouped units (MOESHARD_MOE_DIRECT_WARP bit 4, both forms): a unit is one row tile of a group —
// the local pairs of one expert, at most 8 (the n8 tile's columns), in pair order; groups in the
// order of their first pair — so an expert several tokens picked is read once for all of them.
// Each column's sums are the same bits as its pair's alone: the mma's columns do not mix.
struct Group {
  int32_t expert, count, pair[8];
};
constexpr int kMaxGroups = static_cast<int>(kMoeDirectMaxPairs);
// The groups, then each group's number (the cursor's `local`), each pair's group if it leads one,
// the local pairs' experts, and the warps' leader counts and their sum (a block of kThreads).
template <int kThreads>
constexpr int GroupBytes() {
  return kMaxGroups * static_cast<int>(sizeof(Group)) + 3 * 4 * kMaxGroups + 4 * (kThreads / 32 + 1);
}
// Where GroupBytes' arrays start, after the groups.
struct GroupArrays {
  int32_t *order, *lead_group, *eid, *cnt;
  __device__ explicit GroupArrays(Group* grp)
      : order(reinterpret_cast<int32_t*>(grp + kMaxGroups)),
        lead_group(order + kMaxGroups),
        eid(order + 2 * kMaxGroups),
        cnt(order + 3 * kMaxGroups) {}
};

// The groups of the n local pairs (n <= kMaxGroups <= kThreads); their count in a.cnt[kThreads / 32].
// Every thread of the block calls it; block barriers inside. One pass over the pairs' experts a thread
// (broadcast shared loads) gives its rank among its expert's pairs, their count and its group's
// leader (the expert's pair of rank rank - rank % 8).
template <int kThreads>
__device__ __forceinline__ void BuildGroups(const int32_t* ids, const int32_t* local, int n, Group* grp,
                                            const GroupArrays& a) {
  static_assert(kMaxGroups <= kThreads, "a thread a local pair");
  constexpr int kWarps = kThreads / 32;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid < n) a.eid[tid] = ids[local[tid]];
  __syncthreads();
  int e = -1, rank = 0, of_e = 0, leader = tid;  // this pair's expert, rank, the expert's count, leader
  if (tid < n) {
    e = a.eid[tid];
#pragma unroll 8
    for (int j = 0; j < n; ++j) {
      const bool same = a.eid[j] == e;
      if (same && j < tid) {
        if (rank % 8 == 0) leader = j;
        ++rank;
      }
      of_e += same;
    }
    if (rank % 8 == 0) leader = tid;
  }
  const bool lead = tid < n && rank % 8 == 0;
  const uint32_t m = __ballot_sync(~0u, lead);
  if (lane == 0) a.cnt[warp] = __popc(m);
  __syncthreads();
  int g = __popc(m & ((1u << lane) - 1u));
  for (int k = 0; k < warp; ++k) g += a.cnt[k];
  if (lead) {
    grp[g].expert = e;
    grp[g].count = min(8, of_e - rank);
    a.order[g] = g;
    a.lead_group[tid] = g;
  }
  __syncthreads();
  if (tid < n) grp[a.lead_group[leader]].pair[rank % 8] = local[tid];
  if (tid == 0) {
    int total = 0;
    for (int k = 0; k < kWarps; ++k) total += a.cnt[k];
    a.cnt[kWarps] = total;
  }
  __syncthreads();
}

// This lane's activations' row in a grouped unit: the token of its column's pair (gate/up) or the
// pair (down); a column past the group's pairs repeats its last.
template <bool kGateUp>
__device__ __forceinline__ int GroupRow(const Group& gr, int top_k, int lane) {
  const int pair = gr.pair[min(lane >> 2, gr.count - 1)];
  return kGateUp ? pair / top_k : pair;
}

// Chunk kc of the 16-row slice starting at `first_row` of view `slice` of expert view `v` into
// `dst` (v null: no bytes, a padding chunk). Lane 0 only: the byte count is expected before either
// copy is issued (the stream kernels' producer does the same with a __syncwarp between).
template <bool kQ8>
__device__ __forceinline__ void StageChunk(uint8_t* dst, uint64_t* bar, const Views* v, int slice, int64_t first_row,
                                           int kc, bool mx, int lane) {
  // Scale bytes a chunk: Q8_0's fp16 a 32 columns, NVFP4's e4m3 a 16, MXFP4's e8m0 a 32.
  const uint32_t sbytes = kQ8 ? kScale : E2m1ScaleBytes(mx);
  if (lane != 0) return;
  MbarrierArriveExpectTx(bar, v ? kData<kQ8> + sbytes : 0);
  if (v) {
    const int64_t idx = first_row / 16 * v->chunks[slice] + kc;
    BulkCopyToShared(dst, v->data[slice] + idx * kData<kQ8>, kData<kQ8>, bar);
    BulkCopyToShared(dst + kData<kQ8>, v->scale[slice] + idx * sbytes, sbytes, bar);
  }
}

// Chunk kc from `sb` into acc: moe_stream.cuh's ComputeStageE2m1 (or ComputeStageQ8), one slice,
// one token; `row`: the activations' row, the pair's token (gate/up) or the pair (down). Every
// column of the n8 tile is that token, so acc[0] / acc[2] are rows g / g + 8 in every lane.
template <bool kGateUp, bool kQ8>
__device__ __forceinline__ void ComputeChunk(const MoeExpertParams& p, const MoeWork& w, const uint8_t* sb, int64_t row,
                                             int kc, int lane, float (&acc)[4]) {
  const int c = lane & 3;
  const uint16_t* brow = (kGateUp ? static_cast<const uint16_t*>(p.x) + row * p.width
                                  : static_cast<const uint16_t*>(w.h) + row * p.inter) +
                         int64_t{kCols} * kc;
  if constexpr (kQ8) {
#pragma unroll 2
    for (int b = 0; b < kCols / 32; ++b) {
      const uint4 v = *reinterpret_cast<const uint4*>(sb + Q8StreamLaneCodes(b, lane));
      uint32_t a[2][4];
      Q8LaneFragments(v.x, v.y, v.z, v.w, a);
      const uint32_t sc =
          *reinterpret_cast<const uint32_t*>(sb + kData<kQ8> + Q8StreamLaneScales(b / 2, lane) + 4 * (b % 2));
      float dg, d8;  // rows g and g + 8
      F16x2ToF32(sc, dg, d8);
      // Q8StreamLaneB's byte offset, in activations: columns 32b + 8c .. + 7 of the chunk.
      const uint4 x = __ldg(reinterpret_cast<const uint4*>(brow + Q8StreamLaneB(b, lane) / 2));
      float part[4];
      MmaBf16Zero(part, a[0][0], a[0][1], a[0][2], a[0][3], x.x, x.y);
      MmaBf16(part, a[1][0], a[1][1], a[1][2], a[1][3], x.z, x.w);
      acc[0] = fmaf(part[0], dg, acc[0]);
      acc[1] = fmaf(part[1], dg, acc[1]);
      acc[2] = fmaf(part[2], d8, acc[2]);
      acc[3] = fmaf(part[3], d8, acc[3]);
    }
  } else {  // e2m1 (NVFP4, MXFP4)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint4 wd = *reinterpret_cast<const uint4*>(sb + (q * 32 + lane) * 16);
      const uint32_t sc = *reinterpret_cast<const uint32_t*>(sb + kData<kQ8> + E2m1ScaleWord(lane, q, w.stream_mx));
      uint32_t s2[2];  // rows g, g + 8
      E2m1ScalePair(sc, q, w.stream_mx, s2);
      const uint32_t s2a = s2[0], s2b = s2[1];
      const uint4* bp = reinterpret_cast<const uint4*>(brow + q * 64 + 16 * c);
      const uint4 bq[2] = {__ldg(bp), __ldg(bp + 1)};
#pragma unroll
      for (int jw = 0; jw < 2; ++jw) {
        uint32_t ag[4], ag8[4];
        DecodeRepacked(jw == 0 ? wd.x : wd.z, s2a, ag);
        DecodeRepacked(jw == 0 ? wd.y : wd.w, s2b, ag8);
        MmaBf16(acc, ag[0], ag8[0], ag[1], ag8[1], bq[jw].x, bq[jw].y);
        MmaBf16(acc, ag[2], ag8[2], ag[3], ag8[3], bq[jw].z, bq[jw].w);
      }
    }
  }
}

// gate/up's output: silu of the gate row times the up row, each rounded to bf16 first.
__device__ __forceinline__ uint16_t GateUpOut(float gate, float up) {
  return DevF32ToBf16(Silu(RoundBf16(gate)) * RoundBf16(up));
}

// Launches `kernel` in one resident wave: as many blocks as `blocks` asks, at most what the SMs
// hold at `smem_bytes` each (the attribute raised once a size is new: `attr_bytes`, per kernel),
// and at most `max_per_sm` an SM where that is positive.
template <typename Kernel>
cudaError_t LaunchOneWave(Kernel kernel, int threads, int smem_bytes, int& attr_bytes, int64_t blocks,
                          const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream, int max_per_sm = 0) {
  if (smem_bytes > attr_bytes) {
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
        e != cudaSuccess) {
      return e;
    }
    attr_bytes = smem_bytes;
  }
  int per_sm = 0;
  if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes);
      e != cudaSuccess) {
    return e;
  }
  if (max_per_sm > 0) per_sm = std::min(per_sm, max_per_sm);
  const int64_t wave = std::max<int64_t>(1, int64_t{per_sm} * std::max(w.num_sms, 1));
  const int64_t grid = std::max<int64_t>(1, std::min(blocks, wave));
  return LaunchPdl(kernel, static_cast<unsigned>(grid), threads, smem_bytes, stream, p, w);
}

}  // namespace moeshard::gpu::stream_direct
