// The direct decode GEMV's down projection with the MLP block's residual update inside it
// (MoeWork::res_s: one token, every expert on this GPU, no output norm). A block takes a 16-row
// slice of the output; warp j computes that slice of slot j's expert over the whole of K through
// its own ring of bulk copies (the warp form's sums, moe_stream_direct_warp.cu: each quarter of K
// apart, the quarters added in order, so each row is the bits the other forms leave in y); then
// the block mixes the slots' rows in slot order and updates the slice of the residual stream:
//   s[r] = (s[r] + pre[r]) + Σ_j weights[j] · y_j[r]
// — norm_rope.cu ResidualRegKernel's ungated update over MoeExpertStepRows' rows, bit for bit. The
// next block's input norm is left to its first GEMV (gemv.h GemvResidualIn without `add`), so the
// residual kernel and its launch go.
//
// Why. At one stream a layer is a chain of ~8 dependent launches; the residual kernel (one block)
// held 5.2 µs of a 48.5 µs layer on an H100 (docs/PERFORMANCE.md, 2026-12-07) for 8 KB of work.
// The earlier folds of this update (a cluster of the token's 8 down blocks, a counter per row tile;
// kernels/moe/PERF_NOTES.md, 2026-12-03) kept down's (pair, row tile) units and paid a cross-block
// reduction; here a block owns whole output rows, so the mix needs only a block barrier. Down's
// bytes per SM are those of the block form (the 8 experts' 16-row slices, every chunk in flight at
// once), in 1/4 as many blocks.
#include <algorithm>

#include "kernels/cuda/pdl.cuh"
#include "kernels/moe/moe_stream_direct.cuh"

namespace moeshard::gpu {
namespace {

using stream_direct::kCols;
using stream_direct::kStage;
using stream_direct::Views;

constexpr int kWarps = 8;  // a warp a slot: top_k <= 8
constexpr int kThreads = 32 * kWarps;
// Chunks in flight a warp (stream_direct::kRingSlots): Qwen3-30B's down K (768) is three chunks, all
// of them at once. Then the rings' barriers, and the block's arrays.
template <bool kQ8>
constexpr int kSlots = stream_direct::kRingSlots<kQ8>;
template <bool kQ8>
constexpr int kBarOffset = stream_direct::RingBarOffset<kQ8>(kWarps);
template <bool kQ8>
constexpr int kViewOffset = stream_direct::RingsEnd<kQ8>(kWarps);
template <bool kQ8>
constexpr int kRowsOffset = kViewOffset<kQ8> + kWarps* static_cast<int>(sizeof(Views));
template <bool kQ8>
constexpr int kIdsOffset = kRowsOffset<kQ8> + kWarps * 16 * 4;
template <bool kQ8>
constexpr int kWeightsOffset = kIdsOffset<kQ8> + kWarps * 4;
template <bool kQ8>
constexpr int kSmem = kWeightsOffset<kQ8> + kWarps * 4;

extern __shared__ __align__(128) uint8_t smem[];

template <bool kQ8>
__global__ void __launch_bounds__(kThreads) DownResidualKernel(MoeExpertParams p, MoeWork w) {
  constexpr int kS = kSlots<kQ8>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int32_t* const ids = reinterpret_cast<int32_t*>(smem + kIdsOffset<kQ8>);
  float* const wts = reinterpret_cast<float*>(smem + kWeightsOffset<kQ8>);
  uint8_t* const ring = smem + warp * kS * kStage<kQ8>;
  uint64_t* const bar = reinterpret_cast<uint64_t*>(smem + kBarOffset<kQ8>) + kS * warp;
  Views* const view = reinterpret_cast<Views*>(smem + kViewOffset<kQ8>) + warp;
  float* const rows = reinterpret_cast<float*>(smem + kRowsOffset<kQ8>);  // [slot][16]
  const int nk = static_cast<int>(p.inter / kCols);
  // Slot `warp`'s expert: written by the routing kernel, two launches back (pdl.cuh rule 1, through
  // L2); the weights are fixed. So the first chunks go out before the wait, while gate/up ends. A
  // slot without a local expert (-1; not with every expert here) adds nothing, as in the update.
  const int32_t id = warp < p.top_k ? __ldcg(p.expert_ids + warp) : -1;
  const bool active = id >= 0;
  if (lane == 0) {
    ids[warp] = id;
    wts[warp] = id >= 0 ? __ldcg(p.weights + warp) : 0.f;  // the routing kernel's too
  }
  // This block's 16 elements of s and pre, read before the wait too (pdl.cuh rule 1): s was last
  // written by the update before (a residual kernel, or this kernel in the layer before), pre by the
  // O projection, both launches back. Read after the wait, one at a time behind the mix's eight
  // weight loads, they were ~9 dependent L2 round trips at the end of the kernel (the first run,
  // H100, 2026-12-08: the step 7 % slower than the residual kernel it replaced).
  const int64_t first_row = 16 * int64_t{blockIdx.x};
  float s_in = 0.f, pre_in = 0.f;
  if (threadIdx.x < 16) {
    s_in = __ldcg(w.res_s + first_row + threadIdx.x);
    if (w.res_pre) pre_in = __ldcg(w.res_pre + first_row + threadIdx.x);
  }
  if (active && lane == 0) {
    const MoeExpertWeights& ew = p.experts[id];
    *view = Views{{ew.down.data, ew.down.data},
                  {ew.down.scale, ew.down.scale},
                  {ew.down.cols / kCols, ew.down.cols / kCols},
                  {ew.down.scale2 * 256.f, ew.down.scale2 * 256.f}};
#pragma unroll
    for (int i = 0; i < kS; ++i) MbarrierInit(bar + i, 1);
    FenceMbarrierInit();
  }
  __syncwarp();
  if (active) {
    for (int i = 0; i < kS && i < nk; ++i) {
      stream_direct::StageChunk<kQ8>(ring + i * kStage<kQ8>, bar + i, view, 0, first_row, i, w.stream_mx, lane);
    }
  }
  PdlWait();
  PdlTrigger();
  if (active) {
    // The slot's h (gate/up's output, readable only now) into L1 at once: each chunk's activations are
    // read inside its computation, so a warp's chunks in sequence would wait on one L2 round trip each
    // (the block form's warps compute one chunk each).
    const char* hrow = reinterpret_cast<const char*>(static_cast<const uint16_t*>(w.h) + int64_t{warp} * p.inter);
    for (int64_t b = int64_t{lane} * 128; b < 2 * p.inter; b += 32 * 128) {
      asm volatile("prefetch.global.L1 [%0];" ::"l"(hrow + b));
    }
    float sum[4] = {0.f, 0.f, 0.f, 0.f}, part[4] = {0.f, 0.f, 0.f, 0.f};
    int q = 0;  // the quarter of K that `part` holds
#pragma unroll 1
    for (int kc = 0; kc < nk; ++kc) {
      for (; kc >= (q + 1) * nk / 4; ++q) {  // the quarters that end before this chunk
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[e] += part[e], part[e] = 0.f;
      }
      MbarrierWait(bar + kc % kS, static_cast<uint32_t>((kc / kS) & 1));
      __syncwarp();
      stream_direct::ComputeChunk<false, kQ8>(p, w, ring + (kc % kS) * kStage<kQ8>, warp, kc, lane, part);
      __syncwarp();  // every lane is done with this buffer before the copy engine refills it
      if (kc + kS < nk) {
        stream_direct::StageChunk<kQ8>(ring + (kc % kS) * kStage<kQ8>, bar + kc % kS, view, 0, first_row, kc + kS,
                                       w.stream_mx, lane);
      }
    }
    for (; q < 4; ++q) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sum[e] += part[e], part[e] = 0.f;
    }
    // Rows g and g + 8 of the slice: accumulators 0 and 2 of column 0, held by the lanes with c == 0.
    if ((lane & 3) == 0) {
      const int g = lane >> 2;
      rows[warp * 16 + g] = sum[0] * view->fin[0];
      rows[warp * 16 + g + 8] = sum[2] * view->fin[0];
    }
  }
  __syncthreads();
  if (threadIdx.x < 16) {
    float acc = 0.f;
    for (int j = 0; j < p.top_k; ++j) {
      if (ids[j] >= 0) acc = fmaf(wts[j], rows[j * 16 + threadIdx.x], acc);
    }
    w.res_s[first_row + threadIdx.x] = (w.res_pre ? s_in + pre_in : s_in) + acc;
  }
}

template <bool kQ8>
cudaError_t LaunchT(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(DownResidualKernel<kQ8>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem<kQ8>);
  if (attr != cudaSuccess) return attr;
  return LaunchPdl(DownResidualKernel<kQ8>, static_cast<unsigned>(p.width / 16), kThreads, kSmem<kQ8>, stream, p, w);
}

}  // namespace

bool MoeDownResidualShape(const MoeExpertParams& p) {
  return p.num_tokens == 1 && p.top_k >= 1 && p.top_k <= kWarps && !p.output_norm && p.width % 16 == 0 &&
         (p.num_total_experts == 0 || p.num_total_experts == p.num_local_experts);
}

cudaError_t LaunchMoeStreamDirectDownResidual(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return w.stream_q8 ? LaunchT<true>(p, w, stream) : LaunchT<false>(p, w, stream);
}

}  // namespace moeshard::gpu
