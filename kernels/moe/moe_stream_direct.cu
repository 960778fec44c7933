// The direct decode GEMV over repacked experts (MoeWork::stream_direct): steps of at most
// kMoeDirectMaxPairs (token, expert) pairs whose experts were repacked for the streaming kernels
// (MoeRepackNvfp4 / MoeRepackMxfp4), without the route and without the streaming kernels' items.
//
// Why. The streaming kernels run 16-64 streams at 2.5-2.7x llama.cpp with MXFP4 experts, but a
// decode step of 1-4 streams through them pays the route and items that start one DRAM round trip
// at a time (bench-model, H200, 2026-12-04: 1 stream 3.66 ms a step against 2.51 for the GEMV
// kernels over the stored blocks). This kernel does for the repacked layout what moe_direct.cu
// does for the stored one: a block of 8 warps takes one (pair, row tile) unit — gate/up: 16 rows
// of gate (warps 0-3) and of up (4-7); down: rows 0-15 (warps 0-3) and 16-31 (4-7) of a 32-row
// tile — each warp one quarter of K in 256-column chunks, the quarters summed in order in shared
// memory. The grid is one resident wave; each block takes units blockIdx.x, + gridDim.x, ...,
// and each warp's two-slot ring (one bulk copy of 2,048 code bytes and one of 256 scale bytes a
// chunk) runs across unit boundaries. The units' expert ids and the experts' views sit in shared
// memory. Each chunk is moe_stream.cuh's ComputeStageE2m1 for one slice and one token, its B
// fragments (16 consecutive activations a lane and quad) read in place (moe_stream_direct.cuh, which
// the warp form, moe_stream_direct_warp.cu, shares; moe_env.h StreamDirectWarpForm picks the form).
//
// From five tokens a step (moe_env.h StreamDirectBlockGrouped) a unit is a row tile of a group — up
// to 8 local pairs of one expert, in pair order, as the n8 tile's columns, each lane's activations
// its column's pair's — so an expert that several tokens picked is read once (uniform routing over
// 128 experts: 8 tokens' 64 pairs touch ~50 experts); the columns do not mix, so each pair's rows are
// the bits of its own unit.
//
// Q8_0 experts in their int8 layout (kMoeQ8Repacked, moe_q8_stream_layout.h) take the kQ8 kernels:
// 4,096 code bytes a chunk, each 32-column block's two k16 steps into a fresh accumulator added
// times the block's fp16 scale, as moe_stream.cuh's ComputeStageQ8.
// First run on the H200 on 2026-12-05 (moe_expert_test, every repacked case; the whole-model KL of
// scripts/gpu_repack_check.sh): on by default since, at the sizes moe_expert.cc's
// StreamDirectShape gives; MOESHARD_MOE_STREAM_DIRECT=0 off (ctest moe_expert_test_no_stream_direct).
#include <algorithm>

#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/moe/moe_device.cuh"
#include "kernels/moe/moe_env.h"
#include "kernels/moe/moe_launch.h"
#include "kernels/moe/moe_q8_stream_layout.h"
#include "kernels/moe/moe_stream_direct.cuh"
#include "kernels/moe/moe_unit_cursor.h"

namespace moeshard::gpu {
namespace {

using stream_direct::Group;
using stream_direct::kCols;
using stream_direct::kData;
using stream_direct::kStage;
using stream_direct::TableBytes;
using stream_direct::Views;

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
// Blocks an SM: the stages' shared memory (37 KB, or 70 KB for Q8_0) allows 4 (3).
template <bool kQ8>
constexpr int kMinBlocks = kQ8 ? 3 : 4;
// Dynamic shared memory: each warp's two stages, the split-K sums, the barriers, the tables.
template <bool kQ8>
constexpr int kRedOffset = kWarps * 2 * kStage<kQ8>;
constexpr int kRedBytes = 2 * 4 * 4 * 32 * 4;  // [slice][quarter][element][lane] floats
template <bool kQ8>
constexpr int kBarOffset = kRedOffset<kQ8> + kRedBytes;
template <bool kQ8>
constexpr int kTableOffset = kBarOffset<kQ8> + kWarps * 2 * 8;

extern __shared__ __align__(128) uint8_t smem[];

template <bool kGateUp, bool kQ8>
struct Direct {
  const MoeExpertParams& p;
  const MoeWork& w;
  const Views* tab;
  const int32_t* ids;  // the pairs' local experts (-1: another GPU's)
  int R;               // row tiles an expert
  int warp, lane, g, c, slice, kc_begin, kc_end;

  // This warp's first row in the unit's view.
  __device__ __forceinline__ int64_t FirstRow(int64_t rt) const { return kGateUp ? 16 * rt : 32 * rt + 16 * slice; }

  // Chunk kc of unit (pair, rt) into this warp's buffer `buf` (e < 0: no bytes, the padding chunk of
  // a quarter shorter than the others).
  __device__ __forceinline__ void Stage(uint32_t buf, uint64_t* bar, int e, int64_t rt, int kc) const {
    stream_direct::StageChunk<kQ8>(smem + buf, bar, e >= 0 ? tab + e : nullptr, slice, FirstRow(rt), kc, w.stream_mx,
                                   lane);
  }

  // Chunk kc from `buf` into acc (stream_direct::ComputeChunk).
  __device__ __forceinline__ void Compute(uint32_t buf, int64_t row, int kc, float (&acc)[4]) const {
    stream_direct::ComputeChunk<kGateUp, kQ8>(p, w, smem + buf, row, kc, lane, acc);
  }

  // The unit's quarters summed in order; warps 0-3 store element q of both slices: rows g and
  // g + 8 of column 2c (q 0, 2) and 2c + 1 (q 1, 3). One pair (gr null): every column is its token,
  // so lanes with c == 0 store column 0; a group: column j is the group's pair j.
  __device__ __forceinline__ void Finish(int e, int64_t pair, int64_t rt, const float (&acc)[4],
                                         const Group* gr = nullptr) const {
    float* red = reinterpret_cast<float*>(smem + kRedOffset<kQ8>);
    const int quarter = warp & 3;
    StoreQuarter(red, slice, quarter, lane, acc);
    __syncthreads();
    const int q = warp, col = 2 * c + (q & 1);
    const bool mine = gr ? col < gr->count : c == 0 && (q & 1) == 0;
    if (e >= 0 && q < 4 && mine) {
      if (gr) pair = gr->pair[col];
      const float s[2] = {QuarterSum(red, 0, q, lane) * tab[e].fin[0], QuarterSum(red, 1, q, lane) * tab[e].fin[1]};
      const int64_t r = g + 8 * (q >> 1);
      if constexpr (kGateUp) {
        static_cast<uint16_t*>(w.h)[pair * p.inter + 16 * rt + r] = stream_direct::GateUpOut(s[0], s[1]);
      } else {
        w.y[pair * p.width + 32 * rt + r] = s[0];
        w.y[pair * p.width + 32 * rt + 16 + r] = s[1];
      }
    }
    __syncthreads();  // the sums are read before the next unit's overwrite them
  }
};

// kEarly (down only; MOESHARD_MOE_DOWN_EARLY=0 off): the ids, the units and the first two chunks
// a warp go out before the wait, so down's first weights stream while gate/up ends; its activations
// (gate/up's h) are read after it. The ids were written two launches back or more (the routing
// kernel; gate/up could let this grid start only once it had waited for that kernel): pdl.cuh rule
// 1, read through L2. As moe_direct.cu's and moe_gemv.cu's direct down kernels do.
// kGrouped: a unit is a row tile of a group of an expert's pairs (stream_direct::Group), each lane's
// activations its column's pair's.
template <bool kGateUp, bool kQ8, bool kEarly = false, bool kGrouped = false>
__global__ void __launch_bounds__(kThreads, kMinBlocks<kQ8>) StreamDirectKernel(MoeExpertParams p, MoeWork w) {
  static_assert(!(kGateUp && kEarly), "gate/up reads the ids of the kernel just before it");
  const int E = p.num_local_experts;
  const int64_t pairs = p.num_tokens * p.top_k;
  Views* tab = reinterpret_cast<Views*>(smem + kTableOffset<kQ8>);
  int32_t* ids = reinterpret_cast<int32_t*>(tab + E);
  stream_direct::LoadViews<kGateUp, kThreads>(p, tab);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint64_t* const bar = reinterpret_cast<uint64_t*>(smem + kBarOffset<kQ8>) + 2 * warp;  // buffer i: bar + i
  if (lane == 0) {
    MbarrierInit(bar, 1);
    MbarrierInit(bar + 1, 1);
    FenceMbarrierInit();
  }
  int32_t* local = ids + pairs;  // the pairs whose experts are on this GPU, in order
  const int32_t& n_local = local[pairs];
  if constexpr (!kEarly) {
    PdlWait();
    PdlTrigger();
  }
  stream_direct::LoadIds<kGateUp, kThreads>(p, w, ids, local);
  Group* const grp = reinterpret_cast<Group*>(reinterpret_cast<uint8_t*>(tab) + TableBytes(E, pairs));
  const stream_direct::GroupArrays ga(grp);
  if constexpr (kGrouped) stream_direct::BuildGroups<kThreads>(ids, local, n_local, grp, ga);
  const int32_t* const ulocal = kGrouped ? ga.order : local;  // the cursors' `pair`: a group's number, grouped
  auto expert_of = [&](const UnitCursor& k) { return kGrouped ? grp[k.pair].expert : ids[k.pair]; };

  Direct<kGateUp, kQ8> d{p, w, tab, ids};
  d.R = static_cast<int>((kGateUp ? p.inter / 16 : p.width / 32));
  d.warp = warp, d.lane = lane, d.g = lane >> 2, d.c = lane & 3, d.slice = warp >> 2;
  const int nk = static_cast<int>((kGateUp ? p.width : p.inter) / kCols), quarter = warp & 3;
  d.kc_begin = quarter * nk / 4, d.kc_end = (quarter + 1) * nk / 4;
  const int mine = d.kc_end - d.kc_begin;
  const int nch = max((nk + 3) / 4, 1);  // every warp counts the largest quarter's chunks
  const int units = (kGrouped ? ga.cnt[kWarps] : n_local) * d.R, grid = static_cast<int>(gridDim.x);
  const int my_units = UnitsOfBlock(units, static_cast<int>(blockIdx.x), grid);
  const int total = my_units * nch;
  const uint32_t base = warp * 2 * kStage<kQ8>;

  // Two cursors over the flattened (unit, chunk) sequence: the copies run two chunks ahead.
  UnitCursor cs{static_cast<int>(blockIdx.x)}, cc{static_cast<int>(blockIdx.x)};
  if (my_units > 0) cs.Seek<kGateUp>(ulocal, d.R, p.top_k), cc.Seek<kGateUp>(ulocal, d.R, p.top_k);
  int staged = 0;
  auto stage_next = [&]() {
    if (staged >= total) return;
    const int e = cs.j < mine ? expert_of(cs) : -1;  // a short quarter counts an empty chunk
    d.Stage(base + (staged & 1) * kStage<kQ8>, bar + (staged & 1), e, cs.rt, d.kc_begin + cs.j);
    ++staged;
    cs.Next<kGateUp>(ulocal, d.R, p.top_k, nch, units, grid);
  };
  stage_next();
  stage_next();
  if constexpr (kEarly) {
    PdlWait();
    PdlTrigger();
  }
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  int e = -1, row = 0;  // the unit's expert and this lane's activations' row, read at its first chunk
#pragma unroll 1
  for (int i = 0; i < total; ++i) {
    if (!kGrouped || cc.j == 0) {
      e = expert_of(cc);
      row = kGrouped ? stream_direct::GroupRow<kGateUp>(grp[cc.pair], p.top_k, lane) : cc.row;
    }
    MbarrierWait(bar + (i & 1), static_cast<uint32_t>((i >> 1) & 1));
    __syncwarp();
    if (cc.j < mine) d.Compute(base + (i & 1) * kStage<kQ8>, row, d.kc_begin + cc.j, acc);
    __syncwarp();  // every lane is done with this buffer before the copy engine refills it
    stage_next();
    if (cc.j == nch - 1) {
      d.Finish(e, cc.pair, cc.rt, acc, kGrouped ? grp + cc.pair : nullptr);
      acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
    }
    cc.Next<kGateUp>(ulocal, d.R, p.top_k, nch, units, grid);
  }
  MOESHARD_PROBE_MARK(0);  // the block's units stored
}

template <bool kGateUp, bool kQ8, bool kEarly, bool kGrouped>
cudaError_t LaunchG(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  const int64_t pairs = p.num_tokens * p.top_k;
  static int attr_bytes = 0;  // the largest size set so far (the attribute is per kernel)
  return stream_direct::LaunchOneWave(StreamDirectKernel<kGateUp, kQ8, kEarly, kGrouped>, kThreads,
                                      kTableOffset<kQ8> + TableBytes(p.num_local_experts, pairs) +
                                          (kGrouped ? stream_direct::GroupBytes<kThreads>() : 0),
                                      attr_bytes, pairs * (kGateUp ? p.inter / 16 : p.width / 32), p, w, stream,
                                      StreamDirectBlocksPerSm(kGateUp, p.num_tokens));
}

template <bool kGateUp, bool kQ8, bool kEarly = false>
cudaError_t LaunchT(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return StreamDirectBlockGrouped(p.num_tokens) ? LaunchG<kGateUp, kQ8, kEarly, true>(p, w, stream)
                                                : LaunchG<kGateUp, kQ8, kEarly, false>(p, w, stream);
}

}  // namespace

cudaError_t LaunchMoeStreamDirectGateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  if (StreamDirectWarpForm(true, p.num_tokens * p.top_k)) return LaunchMoeStreamDirectWarp(true, p, w, stream);
  return w.stream_q8 ? LaunchT<true, true>(p, w, stream) : LaunchT<true, false>(p, w, stream);
}

cudaError_t LaunchMoeStreamDirectDown(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  if (StreamDirectWarpForm(false, p.num_tokens * p.top_k)) return LaunchMoeStreamDirectWarp(false, p, w, stream);
  if (MoeDownEarly())
    return w.stream_q8 ? LaunchT<false, true, true>(p, w, stream) : LaunchT<false, false, true>(p, w, stream);
  return w.stream_q8 ? LaunchT<false, true>(p, w, stream) : LaunchT<false, false>(p, w, stream);
}

}  // namespace moeshard::gpu
