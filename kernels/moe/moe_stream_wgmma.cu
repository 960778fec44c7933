// Prefill-sized steps of repacked e2m1 experts (NVFP4, MXFP4 in the streaming layout of
// moe_stream.cuh) on Hopper's warpgroup MMA with the weights as the A operand in registers:
// each consumer warp decodes its 16-row slices of a 256-column chunk from shared memory into
// m16n8k16 A fragments (DecodeRepacked, as the streaming kernels do) and multiplies them by up
// to 128 tokens at once (wgmma m64nNk16, N = 32 / 64 / 96 / 128, B = the tokens' activations in
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
// A CTA: warpgroups 0 and 1 consume (232 registers a thread); warps 8 and 9 produce. An item is
// (expert, 128-token tile, row block): gate/up 128 intermediate rows (each warp 16 rows of gate
// and the same 16 of up: SwiGLU in registers), down 256 output rows (each warp two 16-row
// slices). Both warpgroups share the tile's activations. A step is half a 256-column chunk; two
// rings, each with its producer warp: the weights (16 slices' codes and the chunk's scale bytes,
// one bulk copy each) six steps deep, the activations (two 64-column quads of up to 128 rows
// through a 2-D tensor map: 32-row boxes, 128-byte swizzle, wgmma's K-major layout) three. Each
// consumer warpgroup decodes two half-quads, issues their eight wgmmas as one group and keeps up
// to two groups in flight. Persistent: items strided over the grid, the row block fastest (CTAs
// that run together share an expert's activations in L2). Every sum runs in a fixed order:
// results repeat bit for bit.
//
// Where the time goes (H100, kernels/moe/PERF_NOTES.md): at Muse Spark's expert size the kernel
// runs ~1.2 us a step whether or not it decodes, multiplies or copies (MOESHARD_MOE_SW_PROBE):
// the consumers' per-step chain, not the tensor cores, the decode or the copies, bounds it.
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/tensor_map.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/cuda/wgmma_rs.cuh"
#include "kernels/moe/moe_device.cuh"
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
// Half-quads decoded before their wgmmas are issued as one group. 1, 2 and 4 measured level on the
// H100 (kernels/moe/PERF_NOTES.md); 2 leaves registers for two sets in flight up to 96 tokens.
constexpr int kGroup = 2;
// Two rings, each with its producer warp: the weights (from DRAM) six steps deep, the activations
// (from L2) in 96 KB: three steps of 128 tokens (six of 64). A weight stage holds the step's codes
// of every slice and the chunk's scale bytes whole (their words interleave the quads).
constexpr int kWStages = 6, kBStages = 6;      // the most; SwArgs::wst, bst say how many run
constexpr int kWCodes = kQ * kChunkCodes / 4;  // a slice's codes in a step
constexpr int kWBytes = kSlices * (kWCodes + kScaleMax);
constexpr int kBBytes = kQ * kQuadB;  // one step of 128 tokens
constexpr int kBRegion = 3 * kBBytes;
static_assert(kBBytes % 1024 == 0, "activation stages stay 1024-byte aligned for the swizzled tiles");

size_t SmemBytes(int E) {
  return 1024 + size_t{kBRegion} + size_t{kWStages} * kWBytes + 256 + sizeof(int32_t) * (E + 1);
}

// The rings in shared memory and a consumer's place in them (one step counter serves both).
struct Rings {
  uint8_t* b;  // kBRegion: SwArgs::bst stages of kQ quads x tok rows
  uint8_t* w;  // [kWStages][kWBytes]
  uint64_t *full_w, *empty_w, *full_b, *empty_b;
};

struct SwArgs {
  const MoeExpertWeights* experts;
  const int32_t* offsets;
  const uint8_t* fast;
  int E;
  int K;        // L (gate/up) or I (down)
  int n_rb;     // row blocks of an expert: I / 128 (gate/up) or L / 256 (down)
  bool mx;      // MXFP4 scale bytes
  uint16_t* h;  // gate/up output [capacity, I] bf16, permuted
  int64_t inter;
  float* y;  // down output [capacity, L] fp32
  int64_t width;
  int tok;       // tokens per item at most: 128 (MOESHARD_MOE_SW_TOK: 32, 64, 96 or 128; benchmarks)
  int wst, bst;  // weight and activation stages in use (MOESHARD_MOE_SW_WST, _BST; benchmarks)
  int probe;     // benchmarks (MOESHARD_MOE_SW_PROBE; wrong results): 1 no decode, 2 no MMA,
                 // 3 no activation copies, 4 no weight copies, 5 neither
};

#ifdef MOESHARD_MOE_SW_DEVICE
// Slot of (warpgroup wg, warp w, slice m) in a stage, and its matrix and first row.
__device__ __forceinline__ int SlotOf(int wg, int w, int m) { return (wg * 2 + m) * 4 + w; }

template <bool kGateUp>
__device__ __forceinline__ const WeightRef& SliceView(const MoeExpertWeights& ew, int rb, int slot, int& row) {
  const int w = slot & 3, m = (slot >> 2) & 1, wg = slot >> 3;
  if constexpr (kGateUp) {
    row = rb * 128 + wg * 64 + w * 16;
    return m ? ew.up : ew.gate;
  } else {
    row = rb * 256 + wg * 128 + m * 64 + w * 16;
    return ew.down;
  }
}

// Sets of A fragments in flight for NT tokens and groups of G half-quads (two k16 steps of both
// slices, 16 registers, each): what the accumulators leave room for (ptxas serializes the wgmmas
// otherwise), and whole sets a step (a step is 4 / G groups).
template <int NT, int G>
__host__ __device__ constexpr int SetsInFlight() {
  if constexpr (G == 4) return 1;
  if constexpr (G == 2) return NT <= 96 ? 2 : 1;
  return NT <= 32 ? 4 : NT < 128 ? 2 : 1;
}

// One warpgroup's item: every step through the rings, then the epilogue. The A fragments of G
// half-quads are decoded, then their 4 G wgmmas issued as one group; D - 1 groups stay in flight
// while the next is decoded, and the other warpgroup's work overlaps this one's waits.
template <bool kGateUp, int NT, int G>
__device__ __forceinline__ void ConsumeItem(const SwArgs& a, int e, int rb, int32_t row0, int ntok, const Rings& r,
                                            uint32_t& cnt, int wg, int w, int lane) {
  constexpr int kAcc = NT / 2;
  float acc[2][kAcc];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[m][i] = 0.f;
  const int steps = a.K / (64 * kQ);
  constexpr int D = SetsInFlight<NT, G>(), kGroups = 2 * kQ / G;
  static_assert(kGroups % D == 0, "a step holds whole rounds of the sets");
  uint32_t buf[D][G][2][8] = {};  // [set][half-quad][slice][ag 0..3, ag8 0..3]
  int pend_w = -1, pend_b = -1;   // the stages whose last wgmmas are not yet known done
  for (int st = 0; st < steps; ++st, ++cnt) {
    const int sw = cnt % a.wst, sb = cnt % a.bst;
    MbarrierWait(&r.full_w[sw], (cnt / a.wst) & 1);
    MbarrierWait(&r.full_b[sb], (cnt / a.bst) & 1);
    const uint8_t* wcodes = r.w + sw * kWBytes;
    const uint8_t* wscale = wcodes + kSlices * kWCodes;
    const uint32_t baddr = SharedAddr(r.b + sb * (kQ * 128 * a.tok));
    const int q0 = (st % (4 / kQ)) * kQ;  // the step's first quad in its chunk
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
            const int l = SlotOf(wg, w, m);
            wd[m] = *reinterpret_cast<const uint4*>(wcodes + l * kWCodes + (q * 32 + lane) * 16);
            const uint32_t sc =
                *reinterpret_cast<const uint32_t*>(wscale + l * kScaleMax + E2m1ScaleWord(lane, q0 + q, a.mx));
            E2m1ScalePair(sc, q0 + q, a.mx, s2[m]);
          }
        }
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          if (a.probe == 1) {
#pragma unroll
            for (int i = 0; i < 8; ++i) set[h][m][i] = (jw == 0 ? wd[m].x : wd[m].z) ^ (i * s2[m][i & 1]);
          } else {
            DecodeRepacked(jw == 0 ? wd[m].x : wd[m].z, s2[m][0], &set[h][m][0]);
            DecodeRepacked(jw == 0 ? wd[m].y : wd[m].w, s2[m][1], &set[h][m][4]);
          }
        }
      }
      WgmmaFence();
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const int hq = gi * G + h, q = hq / 2, jw = hq % 2;
#pragma unroll
        for (int uu = 0; uu < 2 && a.probe != 2; ++uu) {
          const int u = 2 * jw + uu;
          const uint64_t desc = WgmmaDesc(baddr + q * 128 * a.tok + u * 32, 16, 1024);
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
          a.h[(row0 + tok) * a.inter + pi] = DevF32ToBf16(Silu(gv) * uv);
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

template <bool kGateUp, int G>
__device__ __forceinline__ void ConsumeByTokens(const SwArgs& a, int e, int rb, int32_t row0, int ntok, const Rings& r,
                                                uint32_t& cnt, int wg, int w, int lane) {
  switch ((ntok + kBox - 1) / kBox) {
    case 1:
      ConsumeItem<kGateUp, 32, G>(a, e, rb, row0, ntok, r, cnt, wg, w, lane);
      break;
    case 2:
      ConsumeItem<kGateUp, 64, G>(a, e, rb, row0, ntok, r, cnt, wg, w, lane);
      break;
    case 3:
      ConsumeItem<kGateUp, 96, G>(a, e, rb, row0, ntok, r, cnt, wg, w, lane);
      break;
    default:
      ConsumeItem<kGateUp, 128, G>(a, e, rb, row0, ntok, r, cnt, wg, w, lane);
      break;
  }
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

template <bool kGateUp>
__global__ void __launch_bounds__(kThreads, 1) StreamWgmmaKernel(SwArgs a, const __grid_constant__ CUtensorMap bmap) {
#ifdef MOESHARD_MOE_SW_DEVICE
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = SharedAddr(smem_raw);
  Rings r;
  r.b = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  r.w = r.b + kBRegion;
  r.full_w = reinterpret_cast<uint64_t*>(r.w + kWStages * kWBytes);
  r.empty_w = r.full_w + kWStages;
  r.full_b = r.empty_w + kWStages;
  r.empty_b = r.full_b + kBStages;
  int32_t* base = reinterpret_cast<int32_t*>(r.empty_b + kBStages);  // [E + 1]
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  PdlWait();
  PdlTrigger();
  if (warp == 0) MoeTilePrefix(a.offsets, a.fast, a.E, kMoePathNvfp4, a.tok, base, lane);
  if (tid == 0) {
    for (int i = 0; i < kWStages; ++i) {
      MbarrierInit(&r.full_w[i], 1);
      MbarrierInit(&r.empty_w[i], 8);  // lane 0 of each consumer warp
    }
    for (int i = 0; i < kBStages; ++i) {
      MbarrierInit(&r.full_b[i], 1);
      MbarrierInit(&r.empty_b[i], 8);
    }
    FenceMbarrierInit();
  }
  __syncthreads();
  const int total = base[a.E] * a.n_rb;
  const int steps = a.K / (64 * kQ);
  const uint32_t sbytes = a.mx ? 128 : 256;
  if (warp >= 8) {  // the producer warpgroup: warp 8 copies weights, warp 9 activations
    RegsDecrease<40>();
    if (warp > 9) return;
    uint32_t cnt = 0;
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
      int e, rb, ntok;
      int32_t row0;
      ItemOf(a, base, t, e, rb, row0, ntok);
      if (warp == 8) {
        const uint8_t *dsrc = nullptr, *ssrc = nullptr;
        if (lane < kSlices) {
          int row;
          const WeightRef& wr = SliceView<kGateUp>(a.experts[e], rb, lane, row);
          const int64_t idx = int64_t{row / 16} * (wr.cols / 256);
          dsrc = wr.data + idx * kChunkCodes;
          ssrc = wr.scale + idx * sbytes;
        }
        const uint32_t bytes = a.probe >= 4 ? 0 : kSlices * (kWCodes + sbytes);
        for (int st = 0; st < steps; ++st, ++cnt) {
          const int s = cnt % a.wst;
          MbarrierWait(&r.empty_w[s], ((cnt / a.wst) & 1) ^ 1);
          if (lane == 0) MbarrierArriveExpectTx(&r.full_w[s], bytes);
          __syncwarp();
          const int kc = st / (4 / kQ), q0 = (st % (4 / kQ)) * kQ;
          if (dsrc && bytes) {
            uint8_t* sw = r.w + s * kWBytes;
            BulkCopyToShared(sw + lane * kWCodes, dsrc + int64_t{kc} * kChunkCodes + q0 * (kChunkCodes / 4), kWCodes,
                             &r.full_w[s]);
            BulkCopyToShared(sw + kSlices * kWCodes + lane * kScaleMax, ssrc + int64_t{kc} * sbytes, sbytes,
                             &r.full_w[s]);
          }
        }
      } else {
        const int boxes = (ntok + kBox - 1) / kBox;
        const uint32_t bytes = a.probe == 3 || a.probe == 5 ? 0 : kQ * boxes * kBox * 128;
        for (int st = 0; st < steps; ++st, ++cnt) {
          const int s = cnt % a.bst;
          MbarrierWait(&r.empty_b[s], ((cnt / a.bst) & 1) ^ 1);
          if (lane == 0) MbarrierArriveExpectTx(&r.full_b[s], bytes);
          __syncwarp();
          if (lane < kQ * boxes && bytes) {  // quad q, box j
            const int q = lane % kQ, j = lane / kQ;
            TensorCopy2dToShared(r.b + (s * kQ + q) * 128 * a.tok + j * kBox * 128, &bmap, (st * kQ + q) * 64,
                                 row0 + j * kBox, &r.full_b[s]);
          }
        }
      }
    }
    return;
  }
  RegsIncrease<232>();
  const int wg = warp / 4, w = warp % 4;
  uint32_t cnt = 0;
  for (int t = blockIdx.x; t < total; t += gridDim.x) {
    int e, rb, ntok;
    int32_t row0;
    ItemOf(a, base, t, e, rb, row0, ntok);
    ConsumeByTokens<kGateUp, kGroup>(a, e, rb, row0, ntok, r, cnt, wg, w, lane);
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
  static const int v = [] {
    const char* e = std::getenv("MOESHARD_MOE_SW_PROBE");
    return e && *e ? std::atoi(e) : 0;
  }();
  return v;
}

struct Shape3 {
  int tok, wst, bst;
};
// Tokens per item and ring depths: 128, 6 and 3 (the activation stages fill 96 KB: 3 of 128 tokens,
// 6 of 64).
Shape3 RingShape() {
  static const Shape3 v = [] {
    auto env = [](const char* name, int def, int lo, int hi) {
      const char* e = std::getenv(name);
      const int x = e && *e ? std::atoi(e) : def;
      return std::min(std::max(x, lo), hi);
    };
    Shape3 r;
    r.tok = env("MOESHARD_MOE_SW_TOK", 128, 32, 128) / kBox * kBox;
    r.wst = env("MOESHARD_MOE_SW_WST", kWStages, 2, kWStages);
    const int most_b = std::min(kBStages, kBRegion / (kQ * 128 * r.tok));
    r.bst = env("MOESHARD_MOE_SW_BST", most_b, 2, most_b);
    return r;
  }();
  return v;
}

template <bool kGateUp>
cudaError_t LaunchGemm(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  const int E = p.num_local_experts;
  const int64_t L = p.width, I = p.inter, K = kGateUp ? L : I;
  CUtensorMap bmap;
  const void* act = kGateUp ? static_cast<const void*>(w.xg) : w.h;
  if (cudaError_t err = EncodeBf16Map128B(act, w.capacity, K, kBox, &bmap); err != cudaSuccess) return err;
  SwArgs a{p.experts,
           w.offsets,
           w.fast,
           E,
           static_cast<int>(K),
           static_cast<int>(kGateUp ? I / 128 : L / 256),
           w.stream_mx,
           static_cast<uint16_t*>(w.h),
           I,
           w.y,
           L,
           RingShape().tok,
           RingShape().wst,
           RingShape().bst,
           Probe()};
  static std::atomic<bool> smem_set{false};
  if (!smem_set.load(std::memory_order_relaxed)) {
    if (cudaError_t err = cudaFuncSetAttribute(StreamWgmmaKernel<kGateUp>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(SmemBytes(kMaxExperts)));
        err != cudaSuccess) {
      return err;
    }
    smem_set.store(true, std::memory_order_relaxed);
  }
  const int64_t most_items = (w.capacity / a.tok + E) * a.n_rb;
  const unsigned grid = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(most_items, w.num_sms)));
  return LaunchPdl(StreamWgmmaKernel<kGateUp>, grid, kThreads, SmemBytes(E), stream, a, bmap);
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
