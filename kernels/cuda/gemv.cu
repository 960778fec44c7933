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
// Tried and taken out (2026-12-02): split Q8 with bf16 x on the integer units (x staged as
// 24-bit fixed point in byte planes, dp4a): the same time at one token on an H200 (this kernel
// is bound by its round trips, not the int → float conversions). With 2-8 tokens split Q8 with
// bf16 x goes to the tensor-core kernel of gemv_mma.cu.
//
// Also tried and taken out (2026-12-03): the router's top-k folded into its launch (the block that
// finished last, found by a fenced counter, ran the routing kernel's warp code over the logits).
// bench-model one stream 3.00 ms a step against 2.78 without it, four streams 5.80 against 5.54:
// the decode-chain probe (probe.h) put the router's share of the chain at 10.1 us against 3.3 +
// 4.3 for the GEMV and the routing kernel apart — the fences, the counter's round trip and one
// block's serial top-k cost more than the launch they saved.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/act.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/gemv_launch.h"
#include "kernels/cuda/gemv_store.cuh"
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

// Fmt with R rows a warp: kUnroll scaled so that a lane keeps the same bytes in flight.
template <GemvWeight W, int R>
struct FmtR {
  static constexpr int kLoads = Fmt<W>::kLoads, kChunkBytes = Fmt<W>::kChunkBytes;
  static constexpr int kUnroll = Fmt<W>::kUnroll * kRowsPerWarp / R;
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

// x from GemvResidualIn: per token, v = s + add and rmsnorm(v) ⊙ norm into the staged x (fp32),
// the sum of squares as norm_rope.cu's ResidualRegKernel forms it (each of the 256 threads adds
// its float4 pieces tid, tid + 256, ... in order, then BlockSum), so the values are that
// kernel's; block 0 also stores them as xn. Tokens past num_tokens stage zeros. With norm_early,
// token 0's slots hold the norm's weights on entry (GemvKernel staged them before its wait): the
// tokens go last to first, each thread reading the weights of the pieces it then writes.
template <int TB>
__device__ __forceinline__ void ResidualPrologue(const GemvLaunch& a, int nchunks, float4* xs) {
  static_assert(kThreads == 256, "the residual kernel's block size, for the same sums");
  __shared__ float scratch[32];
  const int tid = threadIdx.x, D4 = nchunks * 4;
  const GemvResidualIn& r = a.res;
  for (int ti = 0; ti < TB; ++ti) {
    const int t = r.norm_early ? TB - 1 - ti : ti;
    float4* xt = xs + t * D4;
    if (t >= a.num_tokens) {
      for (int q = tid; q < D4; q += kThreads) xt[XsSlot(q / 4, q % 4)] = make_float4(0.f, 0.f, 0.f, 0.f);
      continue;
    }
    const float4* s4 = reinterpret_cast<const float4*>(r.s + t * a.cols);
    const float4* a4 = r.add ? reinterpret_cast<const float4*>(r.add + t * a.cols) : nullptr;
    // v = s + add, or s alone: the update a kernel before stored.
    auto value = [&](int q) {
      float4 v = s4[q];
      if (a4) {
        const float4 ad = a4[q];
        v.x += ad.x;
        v.y += ad.y;
        v.z += ad.z;
        v.w += ad.w;
      }
      return v;
    };
    float ss = 0.f;
    for (int q = tid; q < D4; q += kThreads) ss += Sq4(value(q));
    ss = BlockSum(ss, scratch);
    const float inv = rsqrtf(ss / static_cast<float>(a.cols) + r.eps);
    for (int q = tid; q < D4; q += kThreads) {
      const float4 v = value(q),
                   nn = r.norm_early ? xs[XsSlot(q / 4, q % 4)] : reinterpret_cast<const float4*>(r.norm)[q];
      float4 y = make_float4(v.x * inv * nn.x, v.y * inv * nn.y, v.z * inv * nn.z, v.w * inv * nn.w);
      if (r.round_x) {
        const auto rb = [](float f) { return DevBf16ToF32(DevF32ToBf16(f)); };
        y = make_float4(rb(y.x), rb(y.y), rb(y.z), rb(y.w));
      }
      xt[XsSlot(q / 4, q % 4)] = y;
      if (blockIdx.x == 0 && r.xn) {
        if (r.xn_dtype == ActDType::kF32) {
          reinterpret_cast<float4*>(static_cast<float*>(r.xn) + t * a.cols)[q] = y;
        } else {
          reinterpret_cast<uint2*>(static_cast<uint16_t*>(r.xn) + t * a.cols)[q] = PackBf16x4(y);
        }
      }
    }
  }
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

// R rows a warp (GemvRowsPerTask): one row takes twice the chunks a lane has in flight, so that
// a long row's loads all go out before the wait as two rows' of a short one do.
// kSplit: a task a block, its warps each an eighth of the columns, the partial sums added in warp
// order through shared memory — for launches of few rows (a router's 128-256, a head gate's), whose
// tasks filled 8-16 blocks (ncu, H100, 2026-12-06: Muse Spark's router 8.4 MB in 16.6 µs).
template <GemvWeight W, int TB, int R = kRowsPerWarp, bool kSplit = false>
__global__ void __launch_bounds__(kThreads, GemvMinBlocks<W, TB>()) GemvKernel(GemvLaunch a) {
  extern __shared__ float4 xs[];  // [TB][nchunks * 4] swizzled pieces
  using F = FmtR<W, R>;
  const int nchunks = static_cast<int>(a.cols / kChunk);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t task = kSplit ? static_cast<int64_t>(blockIdx.x) : static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const bool active = task < a.task_begin[a.num_matrices];
  // The warp's chunks [cbeg, cend): all of them, or (kSplit) its eighth.
  const int per = kSplit ? (nchunks + kWarps - 1) / kWarps : nchunks;
  const int cbeg = kSplit ? min(nchunks, warp * per) : 0, cend = kSplit ? min(nchunks, cbeg + per) : nchunks;
  int mi = 0;
  while (mi + 1 < a.num_matrices && task >= a.task_begin[mi + 1]) ++mi;
  const GemvMatrix& m = a.m[mi];
  const int64_t row0 = (task - a.task_begin[mi]) * R;
  const uint8_t* wrow[R];
  const uint16_t* srow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = row0 + r < m.rows ? row0 + r : m.rows - 1;  // a missing last row re-reads, stores nothing
    wrow[r] = static_cast<const uint8_t*>(m.w) + row * nchunks * F::kChunkBytes;
    srow[r] = W == GemvWeight::kQ8 ? m.scales + row * (a.cols / 32) : nullptr;
  }
  uint4 v[R][F::kUnroll][F::kLoads];
  float sc[R][F::kUnroll];
  auto load = [&](int c0) {
#pragma unroll
    for (int u = 0; u < F::kUnroll; ++u) {
      const int c = c0 + 32 * u;
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int l = 0; l < F::kLoads; ++l) {
          v[r][u][l] = c < cend ? LoadStream(wrow[r] + c * F::kChunkBytes + 16 * l) : make_uint4(0, 0, 0, 0);
        }
        if constexpr (W == GemvWeight::kQ8) sc[r][u] = c < cend ? __half2float(__ushort_as_half(srow[r][c / 2])) : 0.f;
      }
    }
  };
  // The first weights are in flight while the kernel before finishes (pdl.cuh) and while the
  // block stages x.
  if (active) load(cbeg + lane);
  if (a.res.s && a.res.norm_early) {  // ResidualPrologue reads them from token 0's slots
    for (int q = tid; q < nchunks * 4; q += kThreads) {
      xs[XsSlot(q / 4, q % 4)] = reinterpret_cast<const float4*>(a.res.norm)[q];
    }
  }
  PdlWait();
  PdlTrigger();
  if (a.res.s) {
    ResidualPrologue<TB>(a, nchunks, xs);
  } else {
  for (int i = tid; i < TB * nchunks * 4; i += kThreads) {
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
  }
  __syncthreads();
  if (!active) return;

  float acc[R][TB] = {};
  for (int c0 = cbeg + lane; c0 < cend; c0 += 32 * F::kUnroll) {
    if (c0 != cbeg + lane) load(c0);
#pragma unroll
    for (int u = 0; u < F::kUnroll; ++u) {
      const int c = c0 + 32 * u;
      if (c >= cend) break;
#pragma unroll
      for (int r = 0; r < R; ++r) {
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
  if constexpr (kSplit) {
    static_assert(R * TB <= 32, "a lane of warp 0 a (row, token) of the task");
    __shared__ float part[kWarps][R * TB];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < TB; ++t) {
        const float s = WarpSum(acc[r][t]);
        if (lane == 0) part[warp][r * TB + t] = s;
      }
    __syncthreads();
    if (warp == 0 && lane < R * TB) {
      const int r = lane / TB, t = lane % TB;
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += part[w][lane];  // warp order: the same sum every run
      const int64_t row = row0 + r;
      if (row < m.rows && t < a.num_tokens) GemvStoreY(m, a.y_f32, row, t, s);
    }
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int t = 0; t < TB; ++t) {
        const float s = WarpSum(acc[r][t]);
        const int64_t row = row0 + r;
        if (lane == (r * TB + t) % 32 && row < m.rows && t < a.num_tokens) GemvStoreY(m, a.y_f32, row, t, s);
      }
    }
  }
}

// kSplit: a block a task (GemvKernel), so blocks = tasks.
template <GemvWeight W, int TB, int R = kRowsPerWarp, bool kSplit = false>
cudaError_t LaunchTB(const GemvLaunch& a, int64_t blocks, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(TB) * a.cols * sizeof(float);
  static const cudaError_t attr = cudaFuncSetAttribute(GemvKernel<W, TB, R, kSplit>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, kGemvMaxSmemBytes);
  if (attr != cudaSuccess) return attr;
  return LaunchPdl(GemvKernel<W, TB, R, kSplit>, static_cast<unsigned>(blocks), kThreads, smem, stream, a);
}

template <GemvWeight W, bool kSplit = false>
cudaError_t LaunchW(const GemvLaunch& a, int tb, int64_t blocks, cudaStream_t stream) {
  switch (tb) {
    case 1:
      return LaunchTB<W, 1, kRowsPerWarp, kSplit>(a, blocks, stream);
    case 2:
      return LaunchTB<W, 2, kRowsPerWarp, kSplit>(a, blocks, stream);
    case 4:
      return LaunchTB<W, 4, kRowsPerWarp, kSplit>(a, blocks, stream);
    default:
      return LaunchTB<W, 8, kRowsPerWarp, kSplit>(a, blocks, stream);
  }
}

// Launches of few rows (a task a warp would fill fewer blocks than a quarter of the SMs) take the
// split kernel: Muse Spark's router and head gate, Qwen3's router (H100, 2026-12-06: Muse Spark's
// 8-layer decode step 4.50-4.57 -> 4.34-4.36 ms, the router GEMV 16.6 -> 8.6 µs, the head gate
// 12.2 -> 6.7). MOESHARD_GEMV_SPLITK=0 turns it off.
bool GemvSplitFor(int64_t blocks) {
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_GEMV_SPLITK");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  if (!on) return false;
  const int sms = DeviceSmCount();
  return sms > 0 && blocks * 4 < sms;
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

// Eight consecutive values a thread (n is a multiple of 32: whole blocks), one 8-byte load of
// codes and one 16-byte (bf16) or two (fp32) stores: the GEMM path expands a Q8 weight on every
// call, and one value a thread spent more instructions than bytes.
__global__ void ExpandQ8Kernel(const int8_t* codes, const uint16_t* scales, int64_t n, void* out, int out_f32) {
  const int64_t i8 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i8 >= n / 8) return;
  const uint2 q = reinterpret_cast<const uint2*>(codes)[i8];
  const float d = DevF16ToF32(scales[i8 / 4]);
  float v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    v[j] = __fmul_rn(d, static_cast<float>(static_cast<int8_t>((j < 4 ? q.x : q.y) >> (8 * (j % 4)))));
  }
  if (out_f32) {
    float4* o = reinterpret_cast<float4*>(out) + 2 * i8;
    o[0] = make_float4(v[0], v[1], v[2], v[3]);
    o[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    uint32_t h[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) h[j] = uint32_t{DevF32ToBf16(v[2 * j])} | (uint32_t{DevF32ToBf16(v[2 * j + 1])} << 16);
    reinterpret_cast<uint4*>(out)[i8] = make_uint4(h[0], h[1], h[2], h[3]);
  }
}

}  // namespace

int GemvTokensPerLaunch(int64_t cols) {
  int tb = static_cast<int>(kGemvMaxTokens);
  while (tb > 1 && static_cast<int64_t>(tb) * cols * 4 > kGemvMaxSmemBytes) tb /= 2;
  return tb;
}

bool GemvMmaOn() {
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_GEMV_MMA");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

cudaError_t LaunchGemv(const GemvLaunch& a, cudaStream_t stream) {
  // Split Q8 with bf16 x and 2-8 tokens: the tensor-core kernel (gemv_mma.cu) unless MOESHARD_GEMV_MMA=0.
  if (GemvMmaOn() && GemvMmaTakes(a)) return LaunchGemvQ8Mma(a, stream);
  const int64_t tasks = a.task_begin[a.num_matrices];
  const int64_t blocks = (tasks + kWarps - 1) / kWarps;
  int tb = 1;
  while (tb < a.num_tokens) tb *= 2;
  if (a.rows_per_task == kRowsPerWarp && GemvSplitFor(blocks)) {
    switch (a.wtype) {
      case GemvWeight::kQ8:
        return LaunchW<GemvWeight::kQ8, true>(a, tb, tasks, stream);
      case GemvWeight::kBF16:
        return LaunchW<GemvWeight::kBF16, true>(a, tb, tasks, stream);
      default:
        return LaunchW<GemvWeight::kF32, true>(a, tb, tasks, stream);
    }
  }
  switch (a.wtype) {
    case GemvWeight::kQ8:
      if (a.rows_per_task == 1 && tb == 1) return LaunchTB<GemvWeight::kQ8, 1, 1>(a, blocks, stream);
      return LaunchW<GemvWeight::kQ8>(a, tb, blocks, stream);
    case GemvWeight::kBF16: return LaunchW<GemvWeight::kBF16>(a, tb, blocks, stream);
    default: return LaunchW<GemvWeight::kF32>(a, tb, blocks, stream);
  }
}

int GemvRowsPerTask(GemvWeight wtype, int64_t cols, int64_t num_tokens) {
  static const bool one_row = [] {
    const char* v = std::getenv("MOESHARD_GEMV_ONE_ROW");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  const int64_t per_round = int64_t{32} * Fmt<GemvWeight::kQ8>::kUnroll * kChunk;  // columns a warp loads at once
  return one_row && wtype == GemvWeight::kQ8 && num_tokens == 1 && cols > per_round ? 1 : kRowsPerWarp;
}

cudaError_t LaunchGemvSplitQ8(const WeightRef& w, int8_t* codes, uint16_t* scales, cudaStream_t stream) {
  const int64_t n = w.rows * (w.cols / 32);
  SplitQ8Kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(w, codes, scales);
  return cudaGetLastError();
}

cudaError_t LaunchGemvExpandQ8(const int8_t* codes, const uint16_t* scales, int64_t n, void* out, bool out_f32,
                               cudaStream_t stream) {
  ExpandQ8Kernel<<<static_cast<unsigned>((n / 8 + 255) / 256), 256, 0, stream>>>(codes, scales, n, out, out_f32 ? 1 : 0);
  return cudaGetLastError();
}

}  // namespace moeshard::gpu
