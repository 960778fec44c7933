// Decode GEMV for split Q8 weights with bf16 activations and 2 to 8 tokens, on the tensor cores
// (gemv.cu runs one token, fp32 activations and the other formats). Each int8 weight becomes a
// bf16 once (exactly) and serves every token of the launch through one m16n8k16 mma, where
// the scalar path spends an instruction per weight and token.
//
// A block of 4 warps (8 for K > 2048; MOESHARD_GEMV_MMA_WIDE=0: 4) takes a tile of 16 rows of
// one matrix; its warps split K into as many ranges and meet in shared memory, summing in warp
// order (deterministic). Lane (g, c) = (lane / 4,
// lane % 4) reads 8 codes of rows g and g + 8 in each 32-column block (columns 8c..8c+7), its
// A-fragment share of the block's two k-steps (the k order inside a block is permuted; the
// activations are read in the same order, so the dot products are unchanged), and token g's
// same 8 activations from shared memory as its B fragment. Each block's two mma go into a
// zeroed accumulator that the rows' f16 scales then multiply into the sums (fp32), so the only
// rounding beyond fp32 accumulation is the activations' own bf16. A warp's weights of up to
// kBatch blocks are in flight at once, the first batch before the kernel waits for the one
// before it (pdl.cuh).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/gemv_launch.h"
#include "kernels/cuda/gemv_store.cuh"
#include "kernels/cuda/mma_bf16.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/weight_decode.cuh"

namespace moeshard::gpu {
namespace {

constexpr int kTileRows = 16;
constexpr int kBatch = 16;       // 32-column blocks of a warp's weights in flight
constexpr int kXPad = 64;        // bytes after each token's row of x: lanes of different tokens on other banks
constexpr int kMaxSmem = 100 * 1024;

struct Tiles {
  int64_t begin[4] = {};  // 16-row tiles: matrix i owns [begin[i], begin[i + 1])
};

__device__ __forceinline__ uint2 LoadStream8(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// kWarps warps split K: 4, or 8 where 4 would leave a warp's range past one batch (K > 2048):
// then every weight load is issued before the wait, and blocks hold twice the loads in flight.
template <int kWarps>
__global__ void __launch_bounds__(32 * kWarps) GemvQ8MmaKernel(GemvLaunch a, Tiles tl) {
  constexpr int kThreads = 32 * kWarps;
  extern __shared__ uint4 smem4[];
  uint8_t* xs = reinterpret_cast<uint8_t*>(smem4);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, c = lane % 4;
  const int64_t cols = a.cols, xstride = 2 * cols + kXPad;
  const int nt = a.num_tokens;
  const int64_t tile = blockIdx.x;
  int mi = 0;
  while (mi + 1 < a.num_matrices && tile >= tl.begin[mi + 1]) ++mi;
  const GemvMatrix& m = a.m[mi];
  const int64_t r0 = (tile - tl.begin[mi]) * kTileRows;
  const int64_t rg = min(r0 + g, m.rows - 1), rg8 = min(r0 + g + 8, m.rows - 1);  // missing rows re-read, store nothing
  const int nb = static_cast<int>(cols / 32);
  const int kb_begin = warp * nb / kWarps, kb_end = (warp + 1) * nb / kWarps;
  const int8_t* w0 = static_cast<const int8_t*>(m.w) + rg * cols + 8 * c;
  const int8_t* w1 = static_cast<const int8_t*>(m.w) + rg8 * cols + 8 * c;
  const uint16_t* s0 = m.scales + rg * nb;
  const uint16_t* s1 = m.scales + rg8 * nb;

  uint2 q0[kBatch], q1[kBatch];
  uint16_t d0[kBatch], d1[kBatch];
  auto load = [&](int kb0) {
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int kb = kb0 + j;
      if (kb < kb_end) {
        q0[j] = LoadStream8(w0 + 32 * static_cast<int64_t>(kb));
        q1[j] = LoadStream8(w1 + 32 * static_cast<int64_t>(kb));
        d0[j] = __ldg(s0 + kb);
        d1[j] = __ldg(s1 + kb);
      }
    }
  };
  load(kb_begin);
  PdlWait();
  PdlTrigger();
  // x: token t's row at xs + t * xstride (bf16), 16 bytes a thread at a time.
  const int64_t pieces = cols / 8;
  for (int64_t i = tid; i < nt * pieces; i += kThreads) {
    const int64_t t = i / pieces, q = i % pieces;
    *reinterpret_cast<uint4*>(xs + t * xstride + 16 * q) =
        *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.x) + t * a.x_stride + 8 * q);
  }
  __syncthreads();

  const uint8_t* xrow = xs + min(g, nt - 1) * xstride + 16 * c;  // token g (tokens past nt: any row, not stored)
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int kb0 = kb_begin; kb0 < kb_end; kb0 += kBatch) {
    if (kb0 != kb_begin) load(kb0);
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int kb = kb0 + j;
      if (kb >= kb_end) break;
      uint32_t lo[2][2], hi[2][2];  // [row g / g + 8][k-step]
      I8x4ToBf16(q0[j].x, lo[0][0], hi[0][0]);
      I8x4ToBf16(q0[j].y, lo[0][1], hi[0][1]);
      I8x4ToBf16(q1[j].x, lo[1][0], hi[1][0]);
      I8x4ToBf16(q1[j].y, lo[1][1], hi[1][1]);
      const uint4 b = *reinterpret_cast<const uint4*>(xrow + 64 * static_cast<int64_t>(kb));
      float t[4];
      MmaBf16Zero(t, lo[0][0], lo[1][0], hi[0][0], hi[1][0], b.x, b.y);
      MmaBf16(t, lo[0][1], lo[1][1], hi[0][1], hi[1][1], b.z, b.w);
      const float sc0 = __half2float(__ushort_as_half(d0[j])), sc1 = __half2float(__ushort_as_half(d1[j]));
      acc[0] = fmaf(sc0, t[0], acc[0]);
      acc[1] = fmaf(sc0, t[1], acc[1]);
      acc[2] = fmaf(sc1, t[2], acc[2]);
      acc[3] = fmaf(sc1, t[3], acc[3]);
    }
  }
  // Split-K: red[warp][q][lane] after x, summed in warp order by warp 0.
  float* red = reinterpret_cast<float*>(xs + nt * xstride);
#pragma unroll
  for (int q = 0; q < 4; ++q) red[(warp * 4 + q) * 32 + lane] = acc[q];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[(w * 4 + q) * 32 + lane];
    const int64_t row = r0 + g + (q & 2 ? 8 : 0);
    const int tok = 2 * c + (q & 1);
    if (row < m.rows && tok < nt) GemvStoreY(m, a.y_f32, row, tok, s);
  }
}

int MmaWarps(const GemvLaunch& a) {
  static const bool wide = [] {
    const char* v = std::getenv("MOESHARD_GEMV_MMA_WIDE");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return wide && a.cols / 32 > 4 * kBatch ? 8 : 4;
}

size_t MmaSmem(const GemvLaunch& a, int warps) {
  return static_cast<size_t>(a.num_tokens) * (2 * a.cols + kXPad) + warps * 4 * 32 * sizeof(float);
}

template <int kWarps>
cudaError_t LaunchMma(const GemvLaunch& a, const Tiles& tl, cudaStream_t stream) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(GemvQ8MmaKernel<kWarps>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem);
  if (attr != cudaSuccess) return attr;
  return LaunchPdl(GemvQ8MmaKernel<kWarps>, static_cast<unsigned>(tl.begin[a.num_matrices]), 32 * kWarps,
                   MmaSmem(a, kWarps), stream, a, tl);
}

}  // namespace

bool GemvMmaTakes(const GemvLaunch& a) {
  return a.wtype == GemvWeight::kQ8 && !a.x_f32 && a.num_tokens >= 2 && a.num_tokens <= 8 &&
         MmaSmem(a, MmaWarps(a)) <= kMaxSmem;
}

int GemvMmaTokensPerLaunch(int64_t cols) {
  GemvLaunch a;
  a.wtype = GemvWeight::kQ8;
  a.cols = cols;
  for (int n = static_cast<int>(kGemvMaxTokens); n >= 2; --n) {
    a.num_tokens = n;
    if (GemvMmaTakes(a)) return n;
  }
  return 0;
}

cudaError_t LaunchGemvQ8Mma(const GemvLaunch& a, cudaStream_t stream) {
  Tiles tl;
  for (int i = 0; i < a.num_matrices; ++i) tl.begin[i + 1] = tl.begin[i] + (a.m[i].rows + kTileRows - 1) / kTileRows;
  return MmaWarps(a) == 8 ? LaunchMma<8>(a, tl, stream) : LaunchMma<4>(a, tl, stream);
}

}  // namespace moeshard::gpu
