// Decode GEMV (gemv.h). One warp computes kRowsPerWarp rows of y for every token of the launch;
// a block of kWarps warps first stages x [TB, K] in shared memory as fp32.
//
// Columns go in chunks of 16: lane l takes chunks l, l + 32, l + 64, ... of every row it
// computes, so a warp's loads of one row are contiguous (16 bytes a lane for split Q8, 32 for
// bf16, 64 for fp32) and each lane's x columns are fixed. x is stored as float4 pieces, piece p
// of chunk c at slot 4c + (p ^ ((c >> 1) & 3)): in each quarter-warp phase of an LDS.128 the
// eight lanes then hit eight different 16-byte bank groups (without the XOR, lanes 64 bytes
// apart would share four).
//
// Memory-level parallelism: a lane issues the loads of kUnroll chunks of both rows before it
// uses any (128 bytes in flight per lane). Split Q8's scale applies to the fp32 sum of a
// chunk's 16 products (both chunks of a 32-block share it).
//
// Split Q8 with bf16 activations (kI8) runs on the integer dot-product units instead: the
// block stages each 32-column block of x as 24-bit fixed point against the block's largest
// exponent (exact for every element within 2^15 of the block's largest; anything smaller is
// rounded at 2^-23 of it, below fp32 accumulation's own error), split into three byte planes
// hi (signed), mid and lo (unsigned). A chunk's 16 products are then 12 dp4a into three int32
// sums, combined as ((hi·256 + mid)·256 + lo) in fp32 and scaled by the weight block's f16
// scale times the x block's power of two: ~1 instruction a weight instead of an int → float
// conversion (a quarter-rate instruction) and an FMA each. (Measured on an H200: the same time
// as the fp32 path at one token, where the kernel is bound by its round trips; split Q8 with
// bf16 x and 2-8 tokens goes to the tensor-core kernel of gemv_mma.cu instead.)
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/act.cuh"
#include "kernels/cuda/gemv_launch.h"
#include "kernels/cuda/pdl.cuh"

namespace moeshard::gpu {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kRowsPerWarp = 2;
constexpr int kChunk = 16;  // columns

template <GemvWeight W>
struct Fmt {
  static constexpr int kLoads = W == GemvWeight::kQ8 ? 1 : W == GemvWeight::kBF16 ? 2 : 4;  // uint4 per chunk
  static constexpr int kUnroll = W == GemvWeight::kQ8 ? 4 : W == GemvWeight::kBF16 ? 2 : 4;
  static constexpr int kChunkBytes = 16 * kLoads;
};

// Blocks per SM the registers must allow: for one token, every block of a 5,120-row Q/K/V
// launch resident at once (2 rows a warp: 320 blocks), so that all of its weight loads are
// issued before PdlWait (a second wave would fetch its rows only after the first finished).
// More tokens keep more sums in registers (they would spill), and fp32 rows hold 4x the bytes.
template <GemvWeight W, int TB>
constexpr int GemvMinBlocks() {
  return W != GemvWeight::kF32 && TB == 1 ? 3 : 1;
}

__device__ __forceinline__ int XsSlot(int c, int p) { return 4 * c + (p ^ ((c >> 1) & 3)); }

__device__ __forceinline__ uint4 LoadStream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The 16 weights of one chunk as fp32 (split Q8: the codes, unscaled).
template <GemvWeight W>
__device__ __forceinline__ void Decode(const uint4 (&v)[Fmt<W>::kLoads], float (&w)[kChunk]) {
  if constexpr (W == GemvWeight::kQ8) {
    const uint32_t words[4] = {v[0].x, v[0].y, v[0].z, v[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) w[4 * i + j] = static_cast<float>(static_cast<int32_t>(words[i] << (24 - 8 * j)) >> 24);
    }
  } else if constexpr (W == GemvWeight::kBF16) {
#pragma unroll
    for (int l = 0; l < 2; ++l) {
      const uint32_t words[4] = {v[l].x, v[l].y, v[l].z, v[l].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        w[8 * l + 2 * i] = __uint_as_float(words[i] << 16);
        w[8 * l + 2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
      }
    }
  } else {
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      w[4 * l] = __uint_as_float(v[l].x);
      w[4 * l + 1] = __uint_as_float(v[l].y);
      w[4 * l + 2] = __uint_as_float(v[l].z);
      w[4 * l + 3] = __uint_as_float(v[l].w);
    }
  }
}

__device__ __forceinline__ int Dp4aSS(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ int Dp4aSU(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// kI8 staging: x [TB, cols] (bf16) → planes [3][TB][cols] bytes (hi, mid, lo) and one fp32
// power of two per (token, 32-column block) after them. Each thread takes 8 consecutive
// columns (one 16-byte load, all issued at once: one round trip for the block), four threads
// a 32-column block, whose largest exponent field emax they share by two shuffles. x = F ·
// 2^(emax - 149), F = round(M · 2^(e - emax - 1)) for the element's 24-bit significand M and
// exponent field e: |F| < 2^23. A block whose largest exponent field is below 23 (|x| <
// 2^-104) stages as zero; one holding an inf or NaN gets a NaN scale.
__device__ __forceinline__ uint32_t Fixed24(uint32_t bits, int emax) {
  const int e = static_cast<int>((bits >> 23) & 0xFF);
  if (emax < 23 || e == 0) return 0;
  const int m = static_cast<int>((bits & 0x7FFFFFu) | 0x800000u);
  const int sh = emax + 1 - e;  // ≥ 1
  int f = sh > 24 ? 0 : min((m + (1 << (sh - 1))) >> sh, (1 << 23) - 1);
  if (bits & 0x80000000u) f = -f;
  return static_cast<uint32_t>(f);
}

template <int TB>
__device__ __forceinline__ void StageXI8(const GemvLaunch& a, uint8_t* planes, float* xscale) {
  const int64_t cols = a.cols;
  const int groups = static_cast<int>(cols / 8);  // per token
  constexpr int kIters = (TB * (kGemvMaxSmemBytes / 3 / 8) + kThreads - 1) / kThreads;  // an upper bound
  const int64_t plane = static_cast<int64_t>(TB) * cols;
#pragma unroll 4
  for (int it = 0; it < kIters; ++it) {
    if (it * kThreads >= TB * groups) break;  // block-uniform; lanes past the end shuffle too
    const int i = it * kThreads + static_cast<int>(threadIdx.x);
    const bool in = i < TB * groups;
    const int t = i / groups, g = i % groups;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (in && t < a.num_tokens) v = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.x) + t * a.x_stride + 8 * g);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t bits[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      bits[2 * k] = w[k] << 16;
      bits[2 * k + 1] = w[k] & 0xFFFF0000u;
    }
    int emax = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) emax = max(emax, static_cast<int>((bits[k] >> 23) & 0xFF));
    emax = max(emax, __shfl_xor_sync(0xffffffffu, emax, 1));
    emax = max(emax, __shfl_xor_sync(0xffffffffu, emax, 2));
    uint32_t hi[2] = {0, 0}, mid[2] = {0, 0}, lo[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t f = Fixed24(bits[k], emax);
      const int word = k / 4, sh = 8 * (k % 4);
      hi[word] |= ((f >> 16) & 0xFF) << sh;
      mid[word] |= ((f >> 8) & 0xFF) << sh;
      lo[word] |= (f & 0xFF) << sh;
    }
    if (!in) continue;
    const int64_t at = t * cols + 8 * g;
    *reinterpret_cast<uint2*>(planes + at) = make_uint2(hi[0], hi[1]);
    *reinterpret_cast<uint2*>(planes + plane + at) = make_uint2(mid[0], mid[1]);
    *reinterpret_cast<uint2*>(planes + 2 * plane + at) = make_uint2(lo[0], lo[1]);
    if ((g & 3) == 0) {
      xscale[t * (cols / 32) + g / 4] =
          emax == 255 ? __int_as_float(0x7FC00000) : emax >= 23 ? __int_as_float((emax - 22) << 23) : 0.f;
    }
  }
}

// The 16 products of a chunk of split-Q8 codes with the staged x: ((hi·256 + mid)·256 + lo).
__device__ __forceinline__ float DotI8(const uint4& w, const uint4& hi, const uint4& mid, const uint4& lo) {
  int dh = Dp4aSS(w.x, hi.x, 0), dm = Dp4aSU(w.x, mid.x, 0), dl = Dp4aSU(w.x, lo.x, 0);
  dh = Dp4aSS(w.y, hi.y, dh), dm = Dp4aSU(w.y, mid.y, dm), dl = Dp4aSU(w.y, lo.y, dl);
  dh = Dp4aSS(w.z, hi.z, dh), dm = Dp4aSU(w.z, mid.z, dm), dl = Dp4aSU(w.z, lo.z, dl);
  dh = Dp4aSS(w.w, hi.w, dh), dm = Dp4aSU(w.w, mid.w, dm), dl = Dp4aSU(w.w, lo.w, dl);
  // |dh| ≤ 16·127·128 and |dm| ≤ 16·128·255: dh·256 + dm fits in int32.
  return fmaf(static_cast<float>(dh * 256 + dm), 256.f, static_cast<float>(dl));
}

template <GemvWeight W, int TB, bool kI8>
__global__ void __launch_bounds__(kThreads, GemvMinBlocks<W, TB>()) GemvKernel(GemvLaunch a) {
  extern __shared__ float4 xs[];  // [TB][nchunks * 4] swizzled pieces; kI8: StageXI8's planes
  using F = Fmt<W>;
  static_assert(!kI8 || W == GemvWeight::kQ8, "the integer path is for split Q8");
  const int nchunks = static_cast<int>(a.cols / kChunk);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const bool active = task < a.task_begin[a.num_matrices];
  int mi = 0;
  while (mi + 1 < a.num_matrices && task >= a.task_begin[mi + 1]) ++mi;
  const GemvMatrix& m = a.m[mi];
  const int64_t row0 = (task - a.task_begin[mi]) * kRowsPerWarp;
  const uint8_t* wrow[kRowsPerWarp];
  const uint16_t* srow[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t row = row0 + r < m.rows ? row0 + r : m.rows - 1;  // a missing last row re-reads, stores nothing
    wrow[r] = static_cast<const uint8_t*>(m.w) + row * nchunks * F::kChunkBytes;
    srow[r] = W == GemvWeight::kQ8 ? m.scales + row * (a.cols / 32) : nullptr;
  }
  uint4 v[kRowsPerWarp][F::kUnroll][F::kLoads];
  float sc[kRowsPerWarp][F::kUnroll];
  auto load = [&](int c0) {
#pragma unroll
    for (int u = 0; u < F::kUnroll; ++u) {
      const int c = c0 + 32 * u;
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
        for (int l = 0; l < F::kLoads; ++l) {
          v[r][u][l] = c < nchunks ? LoadStream(wrow[r] + c * F::kChunkBytes + 16 * l) : make_uint4(0, 0, 0, 0);
        }
        if constexpr (W == GemvWeight::kQ8) sc[r][u] = c < nchunks ? __half2float(__ushort_as_half(srow[r][c / 2])) : 0.f;
      }
    }
  };
  // The first weights are in flight while the kernel before finishes (pdl.cuh) and while the
  // block stages x.
  if (active) load(lane);
  PdlWait();
  PdlTrigger();
  uint8_t* const planes = reinterpret_cast<uint8_t*>(xs);
  float* const xscale = reinterpret_cast<float*>(planes + 3 * static_cast<int64_t>(TB) * a.cols);
  if constexpr (kI8) StageXI8<TB>(a, planes, xscale);
  for (int i = tid; !kI8 && i < TB * nchunks * 4; i += kThreads) {
    const int t = i / (nchunks * 4), rem = i % (nchunks * 4), c = rem / 4, p = rem % 4;
    float4 xv = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t < a.num_tokens) {
      const int64_t off = t * a.x_stride + c * kChunk + 4 * p;
      if (a.x_f32) {
        xv = *reinterpret_cast<const float4*>(static_cast<const float*>(a.x) + off);
      } else {
        const uint2 b = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(a.x) + off);
        xv = make_float4(__uint_as_float(b.x << 16), __uint_as_float(b.x & 0xffff0000u), __uint_as_float(b.y << 16),
                         __uint_as_float(b.y & 0xffff0000u));
      }
    }
    xs[t * nchunks * 4 + XsSlot(c, p)] = xv;
  }
  __syncthreads();
  if (!active) return;

  float acc[kRowsPerWarp][TB] = {};
  for (int c0 = lane; c0 < nchunks; c0 += 32 * F::kUnroll) {
    if (c0 != lane) load(c0);
#pragma unroll
    for (int u = 0; u < F::kUnroll; ++u) {
      const int c = c0 + 32 * u;
      if (c >= nchunks) break;
      if constexpr (kI8) {
        const int64_t plane = static_cast<int64_t>(TB) * a.cols;
#pragma unroll
        for (int t = 0; t < TB; ++t) {
          const uint8_t* px = planes + t * a.cols + c * kChunk;
          const uint4 hi = *reinterpret_cast<const uint4*>(px);
          const uint4 mid = *reinterpret_cast<const uint4*>(px + plane);
          const uint4 lo = *reinterpret_cast<const uint4*>(px + 2 * plane);
          const float xs2 = xscale[t * (nchunks / 2) + c / 2];
#pragma unroll
          for (int r = 0; r < kRowsPerWarp; ++r) {
            acc[r][t] = fmaf(sc[r][u] * xs2, DotI8(v[r][u][0], hi, mid, lo), acc[r][t]);
          }
        }
      } else {
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          float w[kChunk];
          Decode<W>(v[r][u], w);
#pragma unroll
          for (int t = 0; t < TB; ++t) {
            float s = 0.f;
#pragma unroll
            for (int p = 0; p < 4; ++p) {
              const float4 xv = xs[t * nchunks * 4 + XsSlot(c, p)];
              s = fmaf(w[4 * p], xv.x, s);
              s = fmaf(w[4 * p + 1], xv.y, s);
              s = fmaf(w[4 * p + 2], xv.z, s);
              s = fmaf(w[4 * p + 3], xv.w, s);
            }
            if constexpr (W == GemvWeight::kQ8) {
              acc[r][t] = fmaf(sc[r][u], s, acc[r][t]);
            } else {
              acc[r][t] += s;
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int t = 0; t < TB; ++t) {
      const float s = WarpSum(acc[r][t]);
      const int64_t row = row0 + r;
      if (lane == (r * TB + t) % 32 && row < m.rows && t < a.num_tokens) {
        const float y = m.bias ? s + m.bias[row] : s;
        const int64_t at = t * m.y_stride + row;
        if (a.y_f32) {
          static_cast<float*>(m.y)[at] = y;
        } else {
          static_cast<uint16_t*>(m.y)[at] = DevF32ToBf16(y);
        }
      }
    }
  }
}

template <GemvWeight W, int TB, bool kI8>
cudaError_t LaunchTBI(const GemvLaunch& a, int64_t blocks, cudaStream_t stream) {
  // kI8: three byte planes and a float per 32 columns (3.125 bytes a column, under fp32's 4).
  const size_t smem = static_cast<size_t>(TB) * a.cols * (kI8 ? 3 : sizeof(float)) +
                      (kI8 ? static_cast<size_t>(TB) * (a.cols / 32) * sizeof(float) : 0);
  static const cudaError_t attr =
      cudaFuncSetAttribute(GemvKernel<W, TB, kI8>, cudaFuncAttributeMaxDynamicSharedMemorySize, kGemvMaxSmemBytes);
  if (attr != cudaSuccess) return attr;
  return LaunchPdl(GemvKernel<W, TB, kI8>, static_cast<unsigned>(blocks), kThreads, smem, stream, a);
}

// Split Q8 with bf16 x takes the integer path unless MOESHARD_GEMV_I8=0 (for comparisons).
bool GemvI8Enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_GEMV_I8");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

template <GemvWeight W, int TB>
cudaError_t LaunchTB(const GemvLaunch& a, int64_t blocks, cudaStream_t stream) {
  if constexpr (W == GemvWeight::kQ8) {
    if (!a.x_f32 && GemvI8Enabled()) return LaunchTBI<W, TB, true>(a, blocks, stream);
  }
  return LaunchTBI<W, TB, false>(a, blocks, stream);
}

template <GemvWeight W>
cudaError_t LaunchW(const GemvLaunch& a, int tb, int64_t blocks, cudaStream_t stream) {
  switch (tb) {
    case 1: return LaunchTB<W, 1>(a, blocks, stream);
    case 2: return LaunchTB<W, 2>(a, blocks, stream);
    case 4: return LaunchTB<W, 4>(a, blocks, stream);
    default: return LaunchTB<W, 8>(a, blocks, stream);
  }
}

__global__ void SplitQ8Kernel(WeightRef w, int8_t* codes, uint16_t* scales) {
  const int64_t nb = w.cols / 32;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= w.rows * nb) return;
  const int64_t row = i / nb, b = i % nb;
  const uint8_t* blk = w.data + row * w.row_stride_bytes + (w.col_offset / 32 + b) * 34;
  scales[i] = static_cast<uint16_t>(blk[0] | (blk[1] << 8));
  int8_t* out = codes + row * w.cols + b * 32;
#pragma unroll
  for (int j = 0; j < 32; ++j) out[j] = static_cast<int8_t>(blk[2 + j]);
}

__global__ void ExpandQ8Kernel(const int8_t* codes, const uint16_t* scales, int64_t n, void* out, int out_f32) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = __fmul_rn(DevF16ToF32(scales[i / 32]), static_cast<float>(codes[i]));
  if (out_f32) {
    static_cast<float*>(out)[i] = v;
  } else {
    static_cast<uint16_t*>(out)[i] = DevF32ToBf16(v);
  }
}

}  // namespace

int GemvTokensPerLaunch(int64_t cols) {
  int tb = static_cast<int>(kGemvMaxTokens);
  while (tb > 1 && static_cast<int64_t>(tb) * cols * 4 > kGemvMaxSmemBytes) tb /= 2;
  return tb;
}

cudaError_t LaunchGemv(const GemvLaunch& a, cudaStream_t stream) {
  static const bool mma_on = [] {
    const char* v = std::getenv("MOESHARD_GEMV_MMA");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  if (mma_on && GemvMmaTakes(a)) return LaunchGemvQ8Mma(a, stream);
  const int64_t tasks = a.task_begin[a.num_matrices];
  const int64_t blocks = (tasks + kWarps - 1) / kWarps;
  int tb = 1;
  while (tb < a.num_tokens) tb *= 2;
  switch (a.wtype) {
    case GemvWeight::kQ8: return LaunchW<GemvWeight::kQ8>(a, tb, blocks, stream);
    case GemvWeight::kBF16: return LaunchW<GemvWeight::kBF16>(a, tb, blocks, stream);
    default: return LaunchW<GemvWeight::kF32>(a, tb, blocks, stream);
  }
}

int64_t GemvRowsPerTask() { return kRowsPerWarp; }

cudaError_t LaunchGemvSplitQ8(const WeightRef& w, int8_t* codes, uint16_t* scales, cudaStream_t stream) {
  const int64_t n = w.rows * (w.cols / 32);
  SplitQ8Kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(w, codes, scales);
  return cudaGetLastError();
}

cudaError_t LaunchGemvExpandQ8(const int8_t* codes, const uint16_t* scales, int64_t n, void* out, bool out_f32,
                               cudaStream_t stream) {
  ExpandQ8Kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(codes, scales, n, out, out_f32 ? 1 : 0);
  return cudaGetLastError();
}

}  // namespace moeshard::gpu
