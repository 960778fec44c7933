// Prefill-sized steps of repacked e2m1 experts (NVFP4, MXFP4 in the streaming layout of
// moe_stream.cuh) on Hopper's warpgroup MMA with the weights as the A operand in registers:
// each consumer warp decodes its 16-row slices of a 256-column chunk from shared memory into
// m16n8k16 A fragments (DecodeRepacked, as the streaming kernels do) and multiplies them by up
// to 128 tokens at once (wgmma m64nNk16, N = 32 / 64 / 96 / 112 / 128, B = the tokens' activations in
// shared memory). A weight is decoded once per 128 tokens of its expert, where the streaming
// kernels decode it once per 32 and multiply on mma.sync; nothing is expanded to memory (the
// path that moe_wgmma.cu takes for stored MXFP4 / Q8_0 would write 3.2 GB of bf16 a step at
// Muse Spark's expert size).
//
// The k order. The streaming layout gives lane c of k16 step u of a 64-column quad the columns
// 16c + 4u .. 16c + 4u + 3 (moe_stream.cuh), so the activations are stored with each quad's
// columns permuted to match: position 16u + kk holds column 16c + 4u + j, where kk = 2c + (j & 1)
// + 8 (j >> 1) (moe_stream_decode.h StreamWgmmaPos, checked on the CPU by moe_stream_layout_test).
// The gather kernel writes x that way into the workspace's xg; the gate/up epilogue writes h that
// way for the down GEMM.
//
// A CTA: warpgroups 0 and 1 consume (232 registers a thread); warps 8 and 10 copy weights, warp 9
// activations. An item is (expert, tile of up to kNT tokens, row block): gate/up 128 intermediate
// rows (each warp 16 rows of gate and the same 16 of up: SwiGLU in registers), down 256 output rows
// (each warp two 16-row slices). Both warpgroups share the tile's activations. A step is half a
// 256-column chunk; two rings: the weights (each weight producer 8 slices' codes and scale bytes,
// one bulk copy each, issued by one elected lane) six steps deep, the activations (two 64-column
// quads of the tile's rows through a 2-D tensor map: 32-row boxes, 128-byte swizzle, wgmma's
// K-major layout) in 96 KB. Each consumer warpgroup decodes a group of half-quads, issues their
// wgmmas and keeps two groups in flight. A kernel has two accumulator shapes: kNT tokens (64, 96,
// 112 or 128, chosen by the host from the expected rows of an expert) and 32 for an expert's last rows.
// Persistent: items strided over the grid, the row block fastest (CTAs that run together share an
// expert's activations in L2). Every sum runs in a fixed order: results repeat bit for bit.
//
// Where the time went (ncu source counters, kernels/moe/PERF_NOTES.md): a benchmark branch around
// the wgmmas made ptxas close every group early and wait for it whole; the weight copies, issued
// lane by lane, took ~120 cycles each and bounded the step; four accumulator shapes in one kernel
// left ptxas no registers for two groups in flight (C7512). Without them the kernel runs at 1.4x
// its floor at 753 tokens and 2.2x at 3,012 (H100), the tensor pipe 61 % busy; with 112-token
// items at 3,012 (an eighth fewer idle MMA columns), the step's scale words read at its top and the
// fast SiLU, 2.0x (H100, 2026-12-06).
#include <cuda.h>

#include <algorithm>
#include <atomic>

#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/tensor_map.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/cuda/wgmma_rs.cuh"
#include "kernels/moe/moe_device.cuh"
#include "kernels/moe/moe_env.h"
#include "kernels/moe/moe_launch.h"
#include "kernels/moe/moe_stream_decode.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOESHARD_MOE_SW_DEVICE 1
#endif

namespace moeshard::gpu {
namespace {

constexpr int kTok = 128;           // tokens per item, at most (SwArgs::tok: 128 or fewer)
constexpr int kBox = 32;            // rows of a tensor-map box; N in steps of 32
constexpr int kThreads = 3 * 128;   // two consumer warpgroups; warps 8 and 9 (of the third) produce
constexpr int kSlices = 16;         // weight slices a step: 2 warpgroups x 4 warps x 2
constexpr int kChunkCodes = 2048;   // code bytes of a slice and 256-column chunk (the layout's unit)
constexpr int kScaleMax = 256;      // scale bytes of a slice and chunk (NVFP4; MXFP4 128)
constexpr int kQ = 2;               // 64-column quads a step: half a chunk
constexpr int kQuadB = kTok * 128;  // one quad's activations: 128 rows of 64 bf16
constexpr int kMaxExperts = 1024;   // the tile prefix lives in shared memory
// Rows of a quad in an activation stage for items of up to nt tokens: whole tensor-map boxes.
__host__ __device__ constexpr int StageRows(int nt) { return (nt + kBox - 1) / kBox * kBox; }
// Two rings, each with its producer warp: the weights (from DRAM) six steps deep, the activations
// (from L2) in 96 KB: three steps of 128 tokens (six of 64). A weight stage holds the step's codes
// of every slice and the chunk's scale bytes whole (their words interleave the quads).
constexpr int kWStages = 6, kBStages = 6;      // the most; SwArgs::wst, bst say how many run
constexpr int kWCodes = kQ * kChunkCodes / 4;  // a slice's codes in a step
constexpr int kWBytes = kSlices * (kWCodes + kScaleMax);
constexpr int kBBytes = kQ * kQuadB;  // one step of 128 tokens
constexpr int kBRegion = 3 * kBBytes;
static_assert(kBBytes % 1024 == 0, "activation stages stay 1024-byte aligned for the swizzled tiles");

// The 32-token form as a kernel of its own (kNT = 32: items of one 32-row box, MOESHARD_MOE_SW_TOK=32):
// two CTAs an SM, so four consumer warps a scheduler instead of two. At ~24 rows an expert (T ~ 750
// at the issue shape) the consumers' decode and wgmma chain issues ~36 % of the cycles with two warps
// a scheduler (ncu, kernels/moe/PERF_NOTES.md): twice the warps hide twice the latency. Half the
// shared memory each (weights 4 steps deep, activations 3 steps of 32 rows) and 80 registers a thread
// at launch: the consumers take 104, the producers go down to 32 (24 spilled in the down kernel).
// SmemBytes: the 1024-byte alignment slack, the rings, 512 bytes of barriers and item slots (the
// weight, activation and item rings'), the tile prefix.
template <int kNT>
struct Form {
  static constexpr bool kPair = kNT == kBox;
  static constexpr int kCtas = kPair ? 2 : 1;
  static constexpr int kWSt = kPair ? 4 : kWStages;
  static constexpr int kBReg = kPair ? 3 * kQ * 128 * kBox : kBRegion;
  static constexpr int kConsumerRegs = kPair ? 104 : 232, kProducerRegs = kPair ? 32 : 40;
  static constexpr size_t SmemBytes(int E) {
    return 1024 + size_t{kBReg} + size_t{kWSt} * kWBytes + 512 + sizeof(int32_t) * (E + 1);
  }
};
static_assert(2 * (Form<kBox>::SmemBytes(kMaxExperts) + 1024) <= 228 * 1024, "two CTAs of the 32-token form an SM");
static_assert(Form<kBox>::kBReg % 1024 == 0, "activation stages stay 1024-byte aligned for the swizzled tiles");

// The rings in shared memory and a consumer's place in them (one step counter serves both).
struct Rings {
  uint8_t* b;  // Form::kBReg: SwArgs::bst stages of kQ quads x tok rows
  uint8_t* w;  // [Form::kWSt][kWBytes]
  uint64_t *full_w, *empty_w, *full_b, *empty_b;
};

// A place in a ring of n stages: the stage and its phase parity, advanced by one step (no divisions
// on the consumers' path: the ring depths are runtime values, a division a step cost ~50 instructions).
struct RingPos {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void Next(int n) {
    if (++stage == n) stage = 0, phase ^= 1u;
  }
};

struct SwArgs {
  const MoeExpertWeights* experts;
  const int32_t* offsets;
  const uint8_t* fast;
  int path;  // the experts it takes: MoeWork::fast == kMoePathNvfp4 (every repacked one) or kMoePathSw
  int E;
  int K;        // L (gate/up) or I (down)
  int n_rb;     // row blocks of an expert: I / 128 (gate/up) or L / 256 (down)
  bool mx;      // MXFP4 scale bytes
  uint16_t* h;  // gate/up output [capacity, I] bf16, permuted
  int64_t inter;
  float* y;  // down output [capacity, L] fp32
  int64_t width;
  int tok;       // tokens an item takes at most: the kernel's kNT (ItemTokens)
  int wst, bst;  // weight and activation stages in use (MOESHARD_MOE_SW_WST, _BST; benchmarks)
  // Benchmarks (MOESHARD_MOE_SW_PROBE; wrong results): 3 no activation copies, 4 no weight copies,
  // 5 neither. Producers only: a branch around the consumers' wgmmas made ptxas close each group
  // early and wait for it whole (kernels/moe/PERF_NOTES.md).
  int probe;
  // 1: the second kernel of a pair step (MoeWork::sw_pair), which does not wait for the kernel before:
  // its experts are not the first kernel's, its inputs were written two launches back or more
  // (pdl.cuh's rule 1) and its outputs are rows the first kernel does not touch, so it can take each
  // SM the first kernel leaves. One warp of each CTA waits before it exits, so the grid cannot
  // complete before the first's and the kernel after both still waits for both (pdl.cuh's rule 2,
  // which asks it of every thread for the same end).
  int defer;
  // The two-CTA kernel's item counter (its first item is blockIdx.x, the rest gridDim.x + a draw;
  // MoeWork::sw_next, zeroed by the route each step); null: items strided over the grid.
  int32_t* next;
};

#ifdef MOESHARD_MOE_SW_DEVICE
// Slot of (warpgroup wg, warp w, slice m) in a weight stage. The two weight producers copy 8
// consecutive 16-row slices of one matrix each: gate/up's warp 8 the gate rows of the row block
// (wg * 64 + w * 16 in slots 0..7), warp 10 the same rows of up (slots 8..15); down's 256 rows are
// wg * 128 + m * 64 + w * 16, slots 0..15 in that order, warp 8 the first 8, warp 10 the rest.
template <bool kGateUp>
__device__ __forceinline__ int SlotOf(int wg, int w, int m) {
  return kGateUp ? m * 8 + wg * 4 + w : (wg * 2 + m) * 4 + w;
}

// Sets of A fragments in flight (G half-quads, two k16 steps of both slices, 16 registers, each):
// two, so a warpgroup decodes one set while the wgmmas of the other run. ptxas keeps that only while
// the kernel's accumulator shapes are few: a kernel holds a 32-token form (an expert's last rows)
// and one larger one (StreamWgmmaKernel's kNT); with all four forms in one kernel ptxas serialized
// every wgmma (C7512, insufficient registers).
constexpr int kSets = 2;

// One warpgroup's item: every step through the rings, then the epilogue. The A fragments of G
// half-quads are decoded, then their 4 G wgmmas issued as one group; D - 1 groups stay in flight
// while the next is decoded, and the other warpgroup's work overlaps this one's waits.
// kRows: rows of a quad in an activation stage, the kernel's kNT in whole 32-row boxes; kLean: the
// two-CTA form's register budget (Form), which leaves no room for the step's codes read at its top.
template <bool kGateUp, int NT, int G, int kRows, bool kLean = false>
__device__ __forceinline__ void ConsumeItem(const SwArgs& a, int e, int rb, int32_t row0, int ntok, const Rings& r,
                                            RingPos& pw, RingPos& pb, int wg, int w, int lane) {
  constexpr int kAcc = NT / 2;
  float acc[2][kAcc];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[m][i] = 0.f;
  const int steps = a.K / (64 * kQ);
  constexpr int D = kSets, kGroups = 2 * kQ / G;
  static_assert(kGroups % D == 0, "a step holds whole rounds of the sets");
  uint32_t buf[D][G][2][8] = {};  // [set][half-quad][slice][ag 0..3, ag8 0..3]
  int pend_w = -1, pend_b = -1;   // the stages whose last wgmmas are not yet known done
  // The lane's scale word of a step's quads q0, q0 + 1 lies (q0 / 2) words past its word of quads 0, 1.
  static_assert(kQ == 2, "a step's two quads share the lane's scale word");
  const int scale0 = E2m1ScaleWord(lane, 0, a.mx);
  for (int st = 0; st < steps; ++st, pw.Next(a.wst), pb.Next(a.bst)) {
    const int sw = pw.stage, sb = pb.stage;
    MbarrierWait(&r.full_w[sw], pw.phase);
    MbarrierWait(&r.full_b[sb], pb.phase);
    const uint8_t* wcodes = r.w + sw * kWBytes;
    const uint8_t* wscale = wcodes + kSlices * kWCodes;
    const uint64_t bdesc = WgmmaDesc(SharedAddr(r.b + sb * (kQ * 128 * kRows)), 16, 1024);
    const int q0 = (st % (4 / kQ)) * kQ;  // the step's first quad in its chunk
    // The step's scale words (and, below 112 tokens, its codes) read at its top: read right before
    // their use they stalled the decode on shared memory (ncu, kernels/moe/PERF_NOTES.md). At 112
    // and 128 tokens the accumulators leave no room for the codes of both quads.
    constexpr bool kAllCodes = NT < 112 && !kLean;
    uint32_t scw[kQ][2];
    uint4 wdq[kAllCodes ? kQ : 1][2];
#pragma unroll
    for (int q = 0; q < kQ; ++q)
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const int l = SlotOf<kGateUp>(wg, w, m);
        scw[q][m] = *reinterpret_cast<const uint32_t*>(wscale + l * kScaleMax + scale0 + (q0 >> 1) * 4);
        if constexpr (kAllCodes) {
          wdq[q][m] = *reinterpret_cast<const uint4*>(wcodes + l * kWCodes + (q * 32 + lane) * 16);
        }
      }
    uint4 wd[2];
    uint32_t s2[2][2];
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi) {
      uint32_t(&set)[G][2][8] = buf[gi % D];
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const int hq = gi * G + h, q = hq / 2, jw = hq % 2;
        if (jw == 0) {
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            if constexpr (kAllCodes) {
              wd[m] = wdq[q][m];
            } else {
              const int l = SlotOf<kGateUp>(wg, w, m);
              wd[m] = *reinterpret_cast<const uint4*>(wcodes + l * kWCodes + (q * 32 + lane) * 16);
            }
            E2m1ScalePair(scw[q][m], q0 + q, a.mx, s2[m]);
          }
        }
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          DecodeRepacked(jw == 0 ? wd[m].x : wd[m].z, s2[m][0], &set[h][m][0]);
          DecodeRepacked(jw == 0 ? wd[m].y : wd[m].w, s2[m][1], &set[h][m][4]);
        }
      }
      WgmmaFence();
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const int hq = gi * G + h, q = hq / 2, jw = hq % 2;
#pragma unroll
        for (int uu = 0; uu < 2; ++uu) {
          const int u = 2 * jw + uu;
          const uint64_t desc = WgmmaDescAdd(bdesc, q * 128 * kRows + u * 32);
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            const uint32_t(&f)[8] = set[h][m];
            WgmmaRS<NT>(acc[m], f[2 * uu], f[4 + 2 * uu], f[2 * uu + 1], f[4 + 2 * uu + 1], desc, 1);
          }
        }
      }
      WgmmaCommit();
      WgmmaWait<D - 1>();  // every group but the newest D - 1 is done: set (gi + 1) % D is free
#pragma unroll
      for (int h = 0; h < G; ++h) {
        WgmmaPinRegs(buf[(gi + 1) % D][h][0]);
        WgmmaPinRegs(buf[(gi + 1) % D][h][1]);
      }
      // The previous step's last group (this step's group -1) is done once gi - (D - 1) >= -1.
      if (gi == (D > 2 ? D - 2 : 0) && pend_w >= 0) {
        __syncwarp();
        if (lane == 0) {
          MbarrierArrive(&r.empty_w[pend_w]);
          MbarrierArrive(&r.empty_b[pend_b]);
        }
        pend_w = -1;
      }
    }
    pend_w = sw, pend_b = sb;
  }
  WgmmaWait<0>();
#pragma unroll
  for (int i = 0; i < D; ++i)
#pragma unroll
    for (int h = 0; h < G; ++h) {
      WgmmaPinRegs(buf[i][h][0]);
      WgmmaPinRegs(buf[i][h][1]);
    }
  WgmmaPin(acc[0]);
  WgmmaPin(acc[1]);
  __syncwarp();
  if (lane == 0 && pend_w >= 0) {
    MbarrierArrive(&r.empty_w[pend_w]);
    MbarrierArrive(&r.empty_b[pend_b]);
  }

  const int g = lane >> 2, c = lane & 3;
  const MoeExpertWeights& ew = a.experts[e];
  if constexpr (kGateUp) {
    const float sg = ew.gate.scale2 * 256.f, su = ew.up.scale2 * 256.f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = rb * 128 + wg * 64 + w * 16 + g + 8 * half;
      const int pi = StreamWgmmaPos(i);
#pragma unroll
      for (int n8 = 0; n8 < NT / 8; ++n8) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int tok = n8 * 8 + 2 * c + j;
          if (tok >= ntok) continue;
          const float gv = RoundBf16(acc[0][4 * n8 + 2 * half + j] * sg);
          const float uv = RoundBf16(acc[1][4 * n8 + 2 * half + j] * su);
          // SiLU with the fast exponential and division: the result is rounded to bf16 next, and
          // IEEE expf and the division were a tenth of the kernel's samples at 128 tokens (ncu).
          a.h[(row0 + tok) * a.inter + pi] = DevF32ToBf16(__fdividef(gv, 1.f + __expf(-gv)) * uv);
        }
      }
    }
  } else {
    const float sd = ew.down.scale2 * 256.f;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = rb * 256 + wg * 128 + m * 64 + w * 16 + g + 8 * half;
#pragma unroll
        for (int n8 = 0; n8 < NT / 8; ++n8) {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int tok = n8 * 8 + 2 * c + j;
            if (tok >= ntok) continue;
            a.y[(row0 + tok) * a.width + i] = acc[m][4 * n8 + 2 * half + j] * sd;
          }
        }
      }
  }
}

// An item's tokens: the kernel's form for 33 to kNT of them, the 32-token form below (G = 1 at 112
// and 128 tokens: their accumulators leave 32 registers for the sets). The two-CTA kernel (kNT = 32)
// has the 32-token form only, one half-quad a group (G = 1) in its 104 registers.
template <bool kGateUp, int kNT>
__device__ __forceinline__ void ConsumeByTokens(const SwArgs& a, int e, int rb, int32_t row0, int ntok, const Rings& r,
                                                RingPos& pw, RingPos& pb, int wg, int w, int lane) {
  if constexpr (Form<kNT>::kPair) {
    ConsumeItem<kGateUp, kBox, 1, kBox, true>(a, e, rb, row0, ntok, r, pw, pb, wg, w, lane);
  } else if (ntok <= kBox) {
    ConsumeItem<kGateUp, kBox, 2, StageRows(kNT)>(a, e, rb, row0, ntok, r, pw, pb, wg, w, lane);
  } else {
    ConsumeItem<kGateUp, kNT, kNT >= 112 ? 1 : 2, StageRows(kNT)>(a, e, rb, row0, ntok, r, pw, pb, wg, w, lane);
  }
}

// Where a CTA's items come from. Strided over the grid, except in the two-CTA kernel (kDyn): there
// warp 9 draws each next item (from SwArgs::next when set, else by the stride) an item ahead of
// its own copies and hands it to the other warps through a ring of shared slots, so that CTAs that
// start late — on SMs the pair step's other kernel held — take fewer items (kernels/moe/PERF_NOTES.md:
// items strided over a static grid left a tail). t < total: an item; otherwise the end.
constexpr int kItemSlots = 4;
struct ItemRing {
  volatile int32_t* slot;  // [kItemSlots]
  uint64_t *full, *empty;  // one arrival (warp 9); ten (warps 8 and 10, the eight consumer warps)
};
// k: the items this warp has passed through the ring (its slot k % kItemSlots, phase k / kItemSlots; one
// register where the two-CTA kernel's consumers have none to spare).
__device__ __forceinline__ void PublishItem(const ItemRing& q, int& k, int t, int lane) {
  const int i = k % kItemSlots;
  MbarrierWait(&q.empty[i], ((k / kItemSlots) & 1) ^ 1u);
  if (lane == 0) {
    q.slot[i] = t;
    MbarrierArrive(&q.full[i]);  // release: the slot's value is seen by whoever waits on it
  }
  __syncwarp();
  ++k;
}
__device__ __forceinline__ int ReadItem(const ItemRing& q, int& k, int lane) {
  const int i = k % kItemSlots;
  MbarrierWait(&q.full[i], (k / kItemSlots) & 1);
  const int t = q.slot[i];
  __syncwarp();
  if (lane == 0) MbarrierArrive(&q.empty[i]);
  ++k;
  return t;
}
// Warp 9's draw of the item after t, published before t's copies.
__device__ __forceinline__ int DrawItem(const SwArgs& a, const ItemRing& q, int& p, int t, int lane) {
  int tn = 0;
  if (lane == 0) tn = a.next != nullptr ? atomicAdd(a.next, 1) + static_cast<int>(gridDim.x) : t + gridDim.x;
  tn = __shfl_sync(~0u, tn, 0);
  PublishItem(q, p, tn, lane);
  return tn;
}

// Item t's expert, first grouped row and tokens (at most kTok) and row block.
__device__ __forceinline__ void ItemOf(const SwArgs& a, const int32_t* base, int t, int& e, int& rb, int32_t& row0,
                                       int& ntok) {
  int tile;
  MoeTileOf(base, a.E, t / a.n_rb, e, tile);
  rb = t % a.n_rb;
  const int32_t begin = __ldcg(a.offsets + e), count = __ldcg(a.offsets + e + 1) - begin;
  row0 = begin + tile * a.tok;
  ntok = min(a.tok, count - tile * a.tok);
}
#endif

// kNT: the tokens an item takes at most (SwArgs::tok), 32 (the two-CTA form), 64, 96, 112 or 128.
// kDyn: the two-CTA kernel drawing its items from SwArgs::next (the item ring below), a kernel of its
// own: the ring costs the producers registers, which the consumers give up (96 / 48 instead of 104 /
// 32; 104 / 32 with the ring measured level, kernels/moe/PERF_NOTES.md), so the kernel without it
// stays as it was. The pair step's default since 2026-12-06 (MOESHARD_MOE_SW_DYN).
template <bool kGateUp, int kNT, bool kDyn = false>
__global__ void __launch_bounds__(kThreads, Form<kNT>::kCtas)
    StreamWgmmaKernel(SwArgs a, const __grid_constant__ CUtensorMap bmap) {
#ifdef MOESHARD_MOE_SW_DEVICE
  constexpr int kWSt = Form<kNT>::kWSt;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = SharedAddr(smem_raw);
  Rings r;
  r.b = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  r.w = r.b + Form<kNT>::kBReg;
  r.full_w = reinterpret_cast<uint64_t*>(r.w + kWSt * kWBytes);
  r.empty_w = r.full_w + kWSt;
  r.full_b = r.empty_w + kWSt;
  r.empty_b = r.full_b + kBStages;
  ItemRing q;
  q.full = r.empty_b + kBStages;
  q.empty = q.full + kItemSlots;
  q.slot = reinterpret_cast<int32_t*>(q.empty + kItemSlots);
  int32_t* base = const_cast<int32_t*>(q.slot) + kItemSlots;  // [E + 1]
  static_assert(!kDyn || Form<kNT>::kPair, "only the two-CTA kernel draws its items");
  constexpr int kProducerRegs = kDyn ? 48 : Form<kNT>::kProducerRegs;
  constexpr int kConsumerRegs = kDyn ? 96 : Form<kNT>::kConsumerRegs;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (!a.defer) PdlWait();
  PdlTrigger();
  if (warp == 0) MoeTilePrefix(a.offsets, a.fast, a.E, a.path, a.tok, base, lane);
  if (tid == 0) {
    for (int i = 0; i < kWSt; ++i) {
      MbarrierInit(&r.full_w[i], 2);   // the two weight producers
      MbarrierInit(&r.empty_w[i], 8);  // lane 0 of each consumer warp
    }
    for (int i = 0; i < kBStages; ++i) {
      MbarrierInit(&r.full_b[i], 1);
      MbarrierInit(&r.empty_b[i], 8);
    }
    for (int i = 0; i < kItemSlots; ++i) {
      MbarrierInit(&q.full[i], 1);
      MbarrierInit(&q.empty[i], 10);
    }
    FenceMbarrierInit();
  }
  __syncthreads();
  const int total = base[a.E] * a.n_rb;
  const int steps = a.K / (64 * kQ);
  const uint32_t sbytes = a.mx ? 128 : 256;
  if (warp >= 8) {  // the producer warpgroup: warps 8 and 10 copy weights, warp 9 activations
    RegsDecrease<kProducerRegs>();
    if (warp == 11) {
      // SwArgs::defer: this warp, idle otherwise, holds the CTA until the kernel before has completed,
      // so that the grid cannot complete before it. (This second wait, wherever it is put, costs the
      // down kernels of 32, 96, 112 and 128 tokens 4-8 bytes of spill.)
      if (a.defer) PdlWait();
      return;
    }
    RingPos pos;
    int pi = 0, t = blockIdx.x;
    if (kDyn) {
      if (warp == 9) {
        PublishItem(q, pi, t, lane);
      } else {
        t = ReadItem(q, pi, lane);
      }
    }
    while (t < total) {
      int tn = t + gridDim.x;
      if (kDyn && warp == 9) tn = DrawItem(a, q, pi, t, lane);
      int e, rb, ntok;
      int32_t row0;
      ItemOf(a, base, t, e, rb, row0, ntok);
      if (warp != 9) {
        const int half = warp == 10;
        const MoeExpertWeights& ew = a.experts[e];
        const WeightRef& wr = kGateUp ? (half ? ew.up : ew.gate) : ew.down;
        const int64_t chunks = wr.cols / 256, slice0 = kGateUp ? int64_t{rb} * 8 : int64_t{rb} * 16 + 8 * half;
        const uint8_t* dsrc = wr.data + slice0 * chunks * kChunkCodes;
        const uint8_t* ssrc = wr.scale + slice0 * chunks * sbytes;
        const int64_t dstride = chunks * kChunkCodes, sstride = chunks * sbytes;
        const uint32_t bytes = a.probe >= 4 ? 0 : (kSlices / 2) * (kWCodes + sbytes);
        // One elected lane issues the 8 slices' codes and scale bytes a step, the warp's lanes all
        // computing the same addresses (uniform registers). One thread alone (`lane == 0`) went
        // through an elect loop around every copy, ~120 cycles each: the producers bounded the
        // kernel (ncu, kernels/moe/PERF_NOTES.md).
        for (int st = 0; st < steps; ++st, pos.Next(a.wst)) {
          const int s = pos.stage;
          MbarrierWait(&r.empty_w[s], pos.phase ^ 1u);
          const int kc = st / (4 / kQ), q0 = (st % (4 / kQ)) * kQ;
          uint8_t* sw = r.w + s * kWBytes + half * (kSlices / 2) * kWCodes;
          uint8_t* ss = r.w + s * kWBytes + kSlices * kWCodes + half * (kSlices / 2) * kScaleMax;
          const uint8_t* d = dsrc + int64_t{kc} * kChunkCodes + q0 * (kChunkCodes / 4);
          const uint8_t* sc = ssrc + int64_t{kc} * sbytes;
          if (ElectOne()) {
            MbarrierArriveExpectTx(&r.full_w[s], bytes);
            if (bytes != 0) {
#pragma unroll
              for (int j = 0; j < kSlices / 2; ++j) {
                BulkCopyToShared(sw + j * kWCodes, d + j * dstride, kWCodes, &r.full_w[s]);
                BulkCopyToShared(ss + j * kScaleMax, sc + j * sstride, sbytes, &r.full_w[s]);
              }
            }
          }
          __syncwarp();
        }
      } else {
        const int boxes = (ntok + kBox - 1) / kBox;
        const uint32_t bytes = a.probe == 3 || a.probe == 5 ? 0 : kQ * boxes * kBox * 128;
        for (int st = 0; st < steps; ++st, pos.Next(a.bst)) {
          const int s = pos.stage;
          MbarrierWait(&r.empty_b[s], pos.phase ^ 1u);
          if (ElectOne()) {  // as the weights': one elected lane, every box
            MbarrierArriveExpectTx(&r.full_b[s], bytes);
            if (bytes != 0) {
#pragma unroll
              for (int j = 0; j < kTok / kBox; ++j) {
                if (j >= boxes) break;
#pragma unroll
                for (int q = 0; q < kQ; ++q) {
                  TensorCopy2dToShared(r.b + (s * kQ + q) * 128 * StageRows(kNT) + j * kBox * 128, &bmap,
                                       (st * kQ + q) * 64, row0 + j * kBox, &r.full_b[s]);
                }
              }
            }
          }
          __syncwarp();
        }
      }
      t = kDyn && warp != 9 ? ReadItem(q, pi, lane) : tn;
    }
    return;
  }
  RegsIncrease<kConsumerRegs>();
  const int wg = warp / 4, w = warp % 4;
  RingPos pw, pb;
  int pi = 0;
  for (int t = kDyn ? ReadItem(q, pi, lane) : static_cast<int>(blockIdx.x); t < total;
       t = kDyn ? ReadItem(q, pi, lane) : t + static_cast<int>(gridDim.x)) {
    int e, rb, ntok;
    int32_t row0;
    ItemOf(a, base, t, e, rb, row0, ntok);
    ConsumeByTokens<kGateUp, kNT>(a, e, rb, row0, ntok, r, pw, pb, wg, w, lane);
  }
#else
  __trap();  // built without sm_90a: MoeStreamWgmmaSupported() is false and nothing launches this
#endif
}

// xg[r] = x[rows[r] / top_k] for every grouped row, each 64-column quad permuted
// (StreamWgmmaPos): a thread a quad, 32 column pairs in, 8 16-byte stores out.
__global__ void GatherPermutedKernel(const uint16_t* x, int64_t L, int top_k, const int32_t* rows,
                                     const int32_t* offsets, int E, uint16_t* xg) {
  PdlWait();
  PdlTrigger();
  const int64_t quads = L / 64, n = static_cast<int64_t>(__ldcg(offsets + E)) * quads;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / quads, qd = i % quads;
    const int64_t tok = __ldcg(rows + r) / top_k;
    const uint4* src = reinterpret_cast<const uint4*>(x + tok * L + qd * 64);
    uint32_t in[32];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint4 v = src[k];
      in[4 * k] = v.x, in[4 * k + 1] = v.y, in[4 * k + 2] = v.z, in[4 * k + 3] = v.w;
    }
    uint4* dst = reinterpret_cast<uint4*>(xg + r * L + qd * 64);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      uint32_t o[4];
#pragma unroll
      for (int z = 0; z < 4; ++z) {
        o[z] = in[StreamWgmmaGatherPair(4 * k + z)];
      }
      dst[k] = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
}

int Probe() {
  static const int v = EnvInt("MOESHARD_MOE_SW_PROBE", 0);
  return v;
}

// Tokens an item takes at most: moe_stream_decode.h StreamWgmmaItemTokens (128 in a split step), or
// MOESHARD_MOE_SW_TOK (32: the two-CTA form; 64, 96, 112 or 128), for benchmarks and tests.
int ItemTokens(const MoeExpertParams& p, const MoeWork& w) {
  static const int forced = [] {
    const int v = EnvInt("MOESHARD_MOE_SW_TOK", 0);
    return v == 112 ? v : std::clamp(v, 0, 128) / kBox * kBox;
  }();
  if (forced >= kBox) return forced;
  // A split step's experts hold at least MoeWork::sw_min_rows rows each, and skewed routing gives
  // the hottest hundreds, which the average hides: the fewest items an expert. (The kernel's step
  // costs about the same at 64 tokens as at 128: kernels/moe/PERF_NOTES.md.)
  if (w.stream_split) return 4 * kBox;
  // 32 by the rule is the pair step's (MoeWork::sw_pair, launched above); without it, 64.
  const int t = StreamWgmmaItemTokens(w.capacity, p.num_total_experts > 0 ? p.num_total_experts : p.num_local_experts);
  return t == kBox ? 2 * kBox : t;
}

// path: the experts the kernel takes (SwArgs::path); defer: SwArgs::defer; next: SwArgs::next.
template <bool kGateUp, int kNT, bool kDyn = false>
cudaError_t LaunchGemmNT(const MoeExpertParams& p, const MoeWork& w, const CUtensorMap& bmap, int path, bool defer,
                         cudaStream_t stream, int32_t* next = nullptr) {
  const int E = p.num_local_experts;
  const int64_t L = p.width, I = p.inter, K = kGateUp ? L : I;
  // Ring depths: the weights 6 steps, the activations what 96 KB holds (3 steps of 128 tokens, 4 of
  // 96, 6 of 64); MOESHARD_MOE_SW_WST / _BST lower them, for benchmarks.
  using F = Form<kNT>;
  static const int wst = std::clamp(EnvInt("MOESHARD_MOE_SW_WST", F::kWSt), 2, F::kWSt);
  constexpr int kRows = StageRows(kNT);
  constexpr int kMostB = std::min(kBStages, F::kBReg / (kQ * 128 * kRows));
  static const int bst = std::clamp(EnvInt("MOESHARD_MOE_SW_BST", kMostB), 2, kMostB);
  SwArgs a{p.experts,
           w.offsets,
           w.fast,
           path,
           E,
           static_cast<int>(K),
           static_cast<int>(kGateUp ? I / 128 : L / 256),
           w.stream_mx,
           static_cast<uint16_t*>(w.h),
           I,
           w.y,
           L,
           kNT,
           wst,
           bst,
           Probe(),
           defer ? 1 : 0,
           next};
  static std::atomic<bool> smem_set{false};
  if (!smem_set.load(std::memory_order_relaxed)) {
    if (cudaError_t err =
            cudaFuncSetAttribute(StreamWgmmaKernel<kGateUp, kNT, kDyn>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(F::SmemBytes(kMaxExperts)));
        err != cudaSuccess) {
      return err;
    }
    // The whole carveout for shared memory: two CTAs of the 32-token form an SM need it.
    if (cudaError_t err =
            cudaFuncSetAttribute(StreamWgmmaKernel<kGateUp, kNT, kDyn>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 static_cast<int>(cudaSharedmemCarveoutMaxShared));
        err != cudaSuccess) {
      return err;
    }
    smem_set.store(true, std::memory_order_relaxed);
  }
  const int64_t most_items = (w.capacity / kNT + E) * a.n_rb;
  const unsigned grid =
      static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(most_items, int64_t{F::kCtas} * w.num_sms)));
  return LaunchPdl(StreamWgmmaKernel<kGateUp, kNT, kDyn>, grid, kThreads, F::SmemBytes(E), stream, a, bmap);
}

template <bool kGateUp>
cudaError_t LaunchGemm(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  const int64_t K = kGateUp ? p.width : p.inter;
  CUtensorMap bmap;
  const void* act = kGateUp ? static_cast<const void*>(w.xg) : w.h;
  if (cudaError_t err = EncodeBf16Map128B(act, w.capacity, K, kBox, &bmap); err != cudaSuccess) return err;
  if (w.sw_pair) {
    // The experts with at most 32 rows on the two-CTA kernel, those the route marked kMoePathSw on
    // the 128-token one; the second launched takes the SMs the first leaves (SwArgs::defer).
    // MoeWork::sw_big_first (the default) launches the 128-token kernel first; with sw_dyn (the default;
    // otherwise items strided over the grid) the two-CTA kernel draws its items from a counter
    // (SwArgs::next), so its CTAs that start late, on SMs the 128-token items held, take fewer.
    const bool big_first = w.sw_big_first;
    int32_t* next = w.sw_dyn && w.sw_next != nullptr ? w.sw_next + (kGateUp ? 0 : 1) : nullptr;
    auto pair = [&](bool defer) {
      return next != nullptr ? LaunchGemmNT<kGateUp, kBox, true>(p, w, bmap, kMoePathNvfp4, defer, stream, next)
                             : LaunchGemmNT<kGateUp, kBox>(p, w, bmap, kMoePathNvfp4, defer, stream);
    };
    if (big_first) {
      if (cudaError_t err = LaunchGemmNT<kGateUp, 4 * kBox>(p, w, bmap, kMoePathSw, false, stream);
          err != cudaSuccess) {
        return err;
      }
      return pair(true);
    }
    if (cudaError_t err = pair(false); err != cudaSuccess) return err;
    return LaunchGemmNT<kGateUp, 4 * kBox>(p, w, bmap, kMoePathSw, true, stream);
  }
  const int path = w.stream_split ? int{kMoePathSw} : int{kMoePathNvfp4};
  switch (ItemTokens(p, w)) {
    case kBox:
      return LaunchGemmNT<kGateUp, kBox>(p, w, bmap, path, false, stream);
    case 2 * kBox:
      return LaunchGemmNT<kGateUp, 2 * kBox>(p, w, bmap, path, false, stream);
    case 3 * kBox:
      return LaunchGemmNT<kGateUp, 3 * kBox>(p, w, bmap, path, false, stream);
    case 112:
      return LaunchGemmNT<kGateUp, 112>(p, w, bmap, path, false, stream);
    default:
      return LaunchGemmNT<kGateUp, 4 * kBox>(p, w, bmap, path, false, stream);
  }
}

}  // namespace

bool MoeStreamWgmmaSupported(int E, int64_t L, int64_t I, int64_t capacity) {
#ifndef MOESHARD_HAVE_SM90A
  (void)E, (void)L, (void)I, (void)capacity;
  return false;
#else
  if (E > kMaxExperts || L % 256 != 0 || I % 256 != 0 || L > (int64_t{1} << 20) || I > (int64_t{1} << 20)) return false;
  // The kernels count items ((tiles) x (row blocks)) and grouped rows in 32 bits.
  const int64_t most_items = (capacity / 32 + E) * std::max(I / 128, L / 256);
  return most_items < (int64_t{1} << 31) && capacity < (int64_t{1} << 31) && DeviceIsSm90() &&
         TensorMapEncoder() != nullptr;
#endif
}

cudaError_t LaunchMoeStreamWgmmaGateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  const int64_t quads = w.capacity * (p.width / 64);
  const unsigned gblocks =
      static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((quads + 255) / 256, 16 * w.num_sms)));
  if (cudaError_t err = LaunchPdl(GatherPermutedKernel, gblocks, 256, 0, stream, static_cast<const uint16_t*>(p.x),
                                  p.width, p.top_k, static_cast<const int32_t*>(w.rows),
                                  static_cast<const int32_t*>(w.offsets), p.num_local_experts, w.xg);
      err != cudaSuccess) {
    return err;
  }
  return LaunchGemm<true>(p, w, stream);
}

cudaError_t LaunchMoeStreamWgmmaDown(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return LaunchGemm<false>(p, w, stream);
}

}  // namespace moeshard::gpu
