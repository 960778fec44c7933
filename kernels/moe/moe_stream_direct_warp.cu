// The direct decode GEMV over repacked experts, warp form: a warp takes one 16-row slice of a pair's
// expert (gate/up: the slice's gate rows, then its up rows; down: 16 rows of the output) over the
// whole of K, chunk after chunk through its own ring of kSlots bulk copies, and stores its rows
// itself — no block barrier after the prologue, where the block form (moe_stream_direct.cu) splits
// K over four warps and adds their sums in shared memory between two block barriers a unit.
//
// The same bits as the block form: a warp keeps each quarter of K's sum apart (a fresh
// accumulator from the quarter's first chunk, the block form's warp (slice, quarter)) and adds the
// quarters in order starting from 0 (QuarterSum), empty quarters as +0. So the choice between the
// forms (moe_env.h StreamDirectWarpForm) can follow the step's size without a token's result
// depending on the batch it came in.
//
// Why. At Qwen3-30B's expert size (2,048 x 768) down's K is three chunks: the block form leaves one
// quarter's two warps without a chunk and pays two block barriers for every chunk a warp computes;
// at four streams (32 pairs) each block walks four such units. Here each chunk costs its copy,
// its arithmetic and a warp barrier. Grouped (kGrouped, below), a unit takes all of an expert's pairs
// as the n8 tile's columns, so an expert several tokens picked is read once.
#include <algorithm>

#include "kernels/cuda/pdl.cuh"
#include "kernels/moe/moe_env.h"
#include "kernels/moe/moe_stream_direct.cuh"
#include "kernels/moe/moe_unit_cursor.h"

namespace moeshard::gpu {
namespace {

using stream_direct::BuildGroups;
using stream_direct::Group;
using stream_direct::GroupBytes;
using stream_direct::kCols;
using stream_direct::kStage;
using stream_direct::TableBytes;
using stream_direct::Views;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
// Chunks in flight a warp (stream_direct::kRingSlots), the rings' barriers, then the tables.
template <bool kQ8>
constexpr int kSlots = stream_direct::kRingSlots<kQ8>;
template <bool kQ8>
constexpr int kBarOffset = stream_direct::RingBarOffset<kQ8>(kWarps);
template <bool kQ8>
constexpr int kTableOffset = stream_direct::RingsEnd<kQ8>(kWarps);

extern __shared__ __align__(128) uint8_t smem[];

// s += part and part = 0, four accumulators (one quarter of K folded into its slice's sum).
__device__ __forceinline__ void Fold(float (&s)[4], float (&part)[4]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    s[e] += part[e];
    part[e] = 0.f;
  }
}

// kEarly (down only): as the block form's, the ids and each warp's first kSlots chunks go out
// before the wait; gate/up's h is read after it.
template <bool kGateUp, bool kQ8, bool kEarly, bool kGrouped>
__global__ void __launch_bounds__(kThreads) StreamDirectWarpKernel(MoeExpertParams p, MoeWork w) {
  static_assert(!(kGateUp && kEarly), "gate/up reads the ids of the kernel just before it");
  constexpr int kS = kSlots<kQ8>;
  const int64_t pairs = p.num_tokens * p.top_k;
  Views* tab = reinterpret_cast<Views*>(smem + kTableOffset<kQ8>);
  int32_t* ids = reinterpret_cast<int32_t*>(tab + p.num_local_experts);
  int32_t* local = ids + pairs;  // the pairs whose experts are on this GPU, in order; their count after
  stream_direct::LoadViews<kGateUp, kThreads>(p, tab);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint64_t* const bar = reinterpret_cast<uint64_t*>(smem + kBarOffset<kQ8>) + kS * warp;  // slot i: bar + i
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < kS; ++i) MbarrierInit(bar + i, 1);
    FenceMbarrierInit();
  }
  if constexpr (!kEarly) {
    PdlWait();
    PdlTrigger();
  }
  stream_direct::LoadIds<kGateUp, kThreads>(p, w, ids, local);  // block barriers: the views and mbarriers are set too

  Group* const grp = reinterpret_cast<Group*>(reinterpret_cast<uint8_t*>(tab) + TableBytes(p.num_local_experts, pairs));
  const stream_direct::GroupArrays ga(grp);
  if constexpr (kGrouped) {
    BuildGroups<kThreads>(ids, local, local[pairs], grp, ga);
    local = ga.order;  // the cursor's `pair` is a group
  }
  const int nk = static_cast<int>((kGateUp ? p.width : p.inter) / kCols);  // chunks a slice's row of K
  const int per = kGateUp ? 2 * nk : nk;                                   // chunks a unit
  const int R = static_cast<int>((kGateUp ? p.inter : p.width) / 16);      // units (16-row slices) a pair
  const int units = (kGrouped ? ga.cnt[kWarps] : local[pairs]) * R;
  // The unit's expert; this lane's activations' row (the token of its column's pair for gate/up, the
  // pair for down; a column past a group's pairs repeats its last).
  auto expert_of = [&](const UnitCursor& k) { return kGrouped ? grp[k.pair].expert : ids[k.pair]; };
  auto row_of = [&](const UnitCursor& k) {
    if constexpr (!kGrouped) return k.row;
    return stream_direct::GroupRow<kGateUp>(grp[k.pair], static_cast<int>(p.top_k), lane);
  };
  const int gw = static_cast<int>(blockIdx.x) * kWarps + warp, nw = static_cast<int>(gridDim.x) * kWarps;
  const int total = UnitsOfBlock(units, gw, nw) * per;  // this warp's units, as a block's of a grid of nw
  uint8_t* const ring = smem + warp * kS * kStage<kQ8>;

  // Two cursors over the warp's flattened (unit, chunk) sequence: the copies run kS chunks ahead.
  UnitCursor cs{gw}, cc{gw};
  if (total > 0) cs.Seek<kGateUp>(local, R, p.top_k), cc.Seek<kGateUp>(local, R, p.top_k);
  int staged = 0;
  auto stage_next = [&]() {
    if (staged >= total) return;
    const int sl = kGateUp && cs.j >= nk ? 1 : 0;
    stream_direct::StageChunk<kQ8>(ring + (staged % kS) * kStage<kQ8>, bar + staged % kS, tab + expert_of(cs), sl,
                                   16 * int64_t{cs.rt}, cs.j - sl * nk, w.stream_mx, lane);
    ++staged;
    cs.Next<kGateUp>(local, R, p.top_k, per, units, nw);
  };
#pragma unroll
  for (int i = 0; i < kS; ++i) stage_next();
  if constexpr (kEarly) {
    PdlWait();
    PdlTrigger();
  }
  float gate[4] = {0.f, 0.f, 0.f, 0.f}, up[4] = {0.f, 0.f, 0.f, 0.f}, part[4] = {0.f, 0.f, 0.f, 0.f};
  int q = 0;  // the quarter of K that `part` holds
#pragma unroll 1
  for (int i = 0; i < total; ++i) {
    const bool second = kGateUp && cc.j >= nk;  // the up rows
    const int kc = cc.j - (second ? nk : 0);
    for (; kc >= (q + 1) * nk / 4; ++q) {  // the quarters that end before this chunk
      if (second) {
        Fold(up, part);
      } else {
        Fold(gate, part);
      }
    }
    MbarrierWait(bar + i % kS, static_cast<uint32_t>((i / kS) & 1));
    __syncwarp();
    stream_direct::ComputeChunk<kGateUp, kQ8>(p, w, ring + (i % kS) * kStage<kQ8>, row_of(cc), kc, lane, part);
    __syncwarp();  // every lane is done with this buffer before the copy engine refills it
    stage_next();
    if (kc == nk - 1) {  // the slice's last chunk: its remaining quarters
      for (; q < 4; ++q) {
        if (second) {
          Fold(up, part);
        } else {
          Fold(gate, part);
        }
      }
      q = 0;
      if (!kGateUp || second) {
        const Views& v = tab[expert_of(cc)];
        const int g = lane >> 2, c = lane & 3;
        const int64_t r0 = 16 * int64_t{cc.rt} + g;
        // Rows g and g + 8 of the slice: accumulators 0 and 2 of column 2c, 1 and 3 of column 2c + 1
        // (one pair: every column is it, lanes c == 0 store column 0).
#pragma unroll
        for (int hc = 0; hc < 2; ++hc) {
          const int col = 2 * c + hc;
          int pair = cc.pair;
          if constexpr (kGrouped) {
            if (col >= grp[cc.pair].count) continue;
            pair = grp[cc.pair].pair[col];
          } else if (col != 0) {
            continue;
          }
          if constexpr (kGateUp) {
            uint16_t* h = static_cast<uint16_t*>(w.h) + int64_t{pair} * p.inter;
            h[r0] = stream_direct::GateUpOut(gate[hc] * v.fin[0], up[hc] * v.fin[1]);
            h[r0 + 8] = stream_direct::GateUpOut(gate[2 + hc] * v.fin[0], up[2 + hc] * v.fin[1]);
          } else {
            float* y = w.y + int64_t{pair} * p.width;
            y[r0] = gate[hc] * v.fin[0];
            y[r0 + 8] = gate[2 + hc] * v.fin[0];
          }
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) gate[e] = up[e] = 0.f;
      }
    }
    cc.Next<kGateUp>(local, R, p.top_k, per, units, nw);
  }
}

template <bool kGateUp, bool kQ8, bool kEarly, bool kGrouped>
cudaError_t LaunchT(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  const int64_t pairs = p.num_tokens * p.top_k;
  const int64_t units = pairs * ((kGateUp ? p.inter : p.width) / 16);
  const int cap = DirectWarpHold().max_blocks.load(std::memory_order_relaxed);
  const int64_t blocks = (units + kWarps - 1) / kWarps;
  static int attr_bytes = 0;
  return stream_direct::LaunchOneWave(
      StreamDirectWarpKernel<kGateUp, kQ8, kEarly, kGrouped>, kThreads,
      kTableOffset<kQ8> + TableBytes(p.num_local_experts, pairs) + (kGrouped ? GroupBytes<kThreads>() : 0), attr_bytes,
      cap > 0 ? std::min<int64_t>(blocks, cap) : blocks, p, w, stream);
}

template <bool kGrouped>
cudaError_t LaunchG(bool gate_up, const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  if (gate_up) {
    return w.stream_q8 ? LaunchT<true, true, false, kGrouped>(p, w, stream)
                       : LaunchT<true, false, false, kGrouped>(p, w, stream);
  }
  if (MoeDownEarly()) {
    return w.stream_q8 ? LaunchT<false, true, true, kGrouped>(p, w, stream)
                       : LaunchT<false, false, true, kGrouped>(p, w, stream);
  }
  return w.stream_q8 ? LaunchT<false, true, false, kGrouped>(p, w, stream)
                     : LaunchT<false, false, false, kGrouped>(p, w, stream);
}

}  // namespace

cudaError_t LaunchMoeStreamDirectWarp(bool gate_up, const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return StreamDirectWarpGrouped() ? LaunchG<true>(gate_up, p, w, stream) : LaunchG<false>(gate_up, p, w, stream);
}

}  // namespace moeshard::gpu
