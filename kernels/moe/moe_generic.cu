// The generic expert kernels: any WeightFormat, fp32 or bf16 activations, fp32 arithmetic
// on CUDA cores. They serve the fp32 path (which must match the CPU reference to ~1e-5, so
// no tensor cores) and every expert that the tensor-core path does not take (moe_device.cuh
// FastEligible); blocks of experts that it takes return at once.
//
// Grid (column tiles, row-tile slices, experts). A block computes a 32-row × 64-column tile
// of its expert's output: per step along K it stages 32 rows of input (the expert's grouped
// rows: tokens of x for gate/up, rows of h for down) and 64 weight rows decoded element by
// element with DecodeWeight (which honours strides and column windows), then every thread
// accumulates a 2 × 4 patch. Gate/up keeps both projections' accumulators and writes
// h = silu(gate) · up; with bf16 activations gate, up and h are rounded to bf16 as the
// tensor-core path does. Down writes the fp32 rows of y.
#include <algorithm>

#include "kernels/moe/moe_device.cuh"
#include "kernels/moe/moe_launch.h"

namespace moeshard::gpu {
namespace {

constexpr int kTileR = 32, kTileN = 64, kTileK = 32;
constexpr int kThreads = 256;  // 16 × 16
constexpr int kPerR = kTileR / 16, kPerN = kTileN / 16;
// Few row slices: blocks of experts the tensor-core path takes still cost their launch
// (a persistent grid that skipped them by reading the flags one expert at a time was
// slower: 40 µs against 8 µs at T ≥ 256).
constexpr int kMaxRowSlices = 4;

template <typename Act>
__device__ __forceinline__ float LoadAct(const Act* p, int64_t i) {
  if constexpr (sizeof(Act) == 4) {
    return p[i];
  } else {
    return DevBf16ToF32(p[i]);
  }
}

// kGateUp: in = x (by token), weights gate and up [I, L], out = h [rows, I].
// otherwise: in = h (by grouped row), weight down [L, I], out = y [rows, L] fp32.
template <typename Act, bool kGateUp>
__global__ void __launch_bounds__(kThreads) GenericKernel(MoeExpertParams p, MoeWork w) {
  const int e = blockIdx.z;
  if (w.fast[e]) return;
  const int32_t begin = w.offsets[e], count = w.offsets[e + 1] - begin;
  const int64_t r_first = static_cast<int64_t>(blockIdx.y) * kTileR;
  if (r_first >= count) return;
  __shared__ WeightRef wr[2];
  __shared__ float xs[kTileK][kTileR + 1];
  __shared__ float ws[kGateUp ? 2 : 1][kTileK][kTileN + 1];
  __shared__ int64_t in_row[kTileR];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  if (tid == 0) {
    wr[0] = kGateUp ? p.experts[e].gate : p.experts[e].down;
    wr[1] = p.experts[e].up;
  }
  const int64_t K = kGateUp ? p.width : p.inter, N = kGateUp ? p.inter : p.width;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const Act* in = kGateUp ? static_cast<const Act*>(p.x) : static_cast<const Act*>(w.h);

  for (int64_t r0 = r_first; r0 < count; r0 += static_cast<int64_t>(gridDim.y) * kTileR) {
    __syncthreads();
    if (tid < kTileR) {
      const int64_t r = r0 + tid;
      int64_t row = -1;
      if (r < count) row = kGateUp ? w.rows[begin + r] / p.top_k : begin + r;
      in_row[tid] = row;
    }
    float acc[2][kPerR][kPerN] = {};
    for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
      __syncthreads();
      for (int i = tid; i < kTileR * kTileK; i += kThreads) {
        const int rr = i / kTileK, kk = i % kTileK;
        const int64_t row = in_row[rr], k = k0 + kk;
        xs[kk][rr] = (row >= 0 && k < K) ? LoadAct(in, row * K + k) : 0.f;
      }
      for (int m = 0; m < (kGateUp ? 2 : 1); ++m) {
        for (int i = tid; i < kTileN * kTileK; i += kThreads) {
          const int nn = i / kTileK, kk = i % kTileK;
          const int64_t n = n0 + nn, k = k0 + kk;
          ws[m][kk][nn] = (n < N && k < K) ? DecodeWeight(wr[m], n, k) : 0.f;
        }
      }
      __syncthreads();
#pragma unroll 4
      for (int kk = 0; kk < kTileK; ++kk) {
        float a[kPerR];
#pragma unroll
        for (int i = 0; i < kPerR; ++i) a[i] = xs[kk][ty + 16 * i];
#pragma unroll
        for (int m = 0; m < (kGateUp ? 2 : 1); ++m) {
#pragma unroll
          for (int j = 0; j < kPerN; ++j) {
            const float b = ws[m][kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < kPerR; ++i) acc[m][i][j] = fmaf(a[i], b, acc[m][i][j]);
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kPerR; ++i) {
      const int64_t r = r0 + ty + 16 * i;
      if (r >= count) continue;
      const int64_t out_row = begin + r;
#pragma unroll
      for (int j = 0; j < kPerN; ++j) {
        const int64_t n = n0 + tx + 16 * j;
        if (n >= N) continue;
        if constexpr (!kGateUp) {
          w.y[out_row * N + n] = acc[0][i][j];
        } else if constexpr (sizeof(Act) == 4) {
          static_cast<float*>(w.h)[out_row * N + n] = Silu(acc[0][i][j]) * acc[1][i][j];
        } else {
          const float g = RoundBf16(acc[0][i][j]), u = RoundBf16(acc[1][i][j]);
          static_cast<uint16_t*>(w.h)[out_row * N + n] = DevF32ToBf16(Silu(g) * u);
        }
      }
    }
  }
}

template <bool kGateUp>
cudaError_t LaunchGeneric(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  const int64_t N = kGateUp ? p.inter : p.width;
  // Rows per expert: at most T when a token's ids are distinct, T · top_k in any case.
  const int64_t slices = std::min<int64_t>((p.num_tokens + kTileR - 1) / kTileR, kMaxRowSlices);
  dim3 grid(static_cast<unsigned>((N + kTileN - 1) / kTileN), static_cast<unsigned>(slices),
            static_cast<unsigned>(p.num_local_experts));
  if (p.act_dtype == ActDType::kF32) {
    GenericKernel<float, kGateUp><<<grid, kThreads, 0, stream>>>(p, w);
  } else {
    GenericKernel<uint16_t, kGateUp><<<grid, kThreads, 0, stream>>>(p, w);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchMoeGenericGateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return LaunchGeneric<true>(p, w, stream);
}

cudaError_t LaunchMoeGenericDown(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return LaunchGeneric<false>(p, w, stream);
}

}  // namespace moeshard::gpu
