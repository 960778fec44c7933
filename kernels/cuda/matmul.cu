// Tiled matmul y[T, N] = x[T, K] · Wᵀ with W [N, K] in its stored format.
//
// Each block computes a kTileT × kTileN tile of y. Per step along K it stages a
// kTileT × kTileK slice of x (converted to fp32) and a kTileN × kTileK slice of W
// (decoded element by element by DecodeWeight) in shared memory, then every thread
// accumulates a 2 × 4 patch of outputs in fp32 registers. Decoding happens on chip:
// W is read from global memory once per tile of tokens, in its stored bytes.
// A first, straightforward version: no tensor cores, no vectorized block decode.
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/act.cuh"

namespace moeshard::gpu {
namespace {

constexpr int kTileT = 32, kTileN = 64, kTileK = 32;
constexpr int kThreads = 256;          // 16 × 16 threads
constexpr int kPerT = kTileT / 16;     // 2 tokens per thread
constexpr int kPerN = kTileN / 16;     // 4 weight rows per thread

template <typename Act>
__global__ void __launch_bounds__(kThreads)
MatMulKernel(WeightRef w, const Act* x, int64_t x_stride, Act* y, int64_t y_stride,
             int64_t num_tokens, const float* bias) {
  __shared__ float xs[kTileK][kTileT + 1];
  __shared__ float ws[kTileK][kTileN + 1];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTileT;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const int64_t K = w.cols, N = w.rows;
  float acc[kPerT][kPerN] = {};

  for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
    // Consecutive threads walk along K, so each row's stored bytes are read together.
    for (int i = tid; i < kTileT * kTileK; i += kThreads) {
      int tt = i / kTileK, kk = i % kTileK;
      int64_t t = t0 + tt, k = k0 + kk;
      xs[kk][tt] = (t < num_tokens && k < K) ? LoadF(x + t * x_stride + k) : 0.f;
    }
    for (int i = tid; i < kTileN * kTileK; i += kThreads) {
      int nn = i / kTileK, kk = i % kTileK;
      int64_t n = n0 + nn, k = k0 + kk;
      ws[kk][nn] = (n < N && k < K) ? DecodeWeight(w, n, k) : 0.f;
    }
    __syncthreads();
#pragma unroll 4
    for (int kk = 0; kk < kTileK; ++kk) {
      float a[kPerT], b[kPerN];
#pragma unroll
      for (int i = 0; i < kPerT; ++i) a[i] = xs[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < kPerN; ++j) b[j] = ws[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < kPerT; ++i)
#pragma unroll
        for (int j = 0; j < kPerN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < kPerT; ++i) {
    int64_t t = t0 + ty + 16 * i;
    if (t >= num_tokens) continue;
#pragma unroll
    for (int j = 0; j < kPerN; ++j) {
      int64_t n = n0 + tx + 16 * j;
      if (n >= N) continue;
      float v = acc[i][j] + (bias ? bias[n] : 0.f);
      StoreF(y + t * y_stride + n, v);
    }
  }
}

}  // namespace

cudaError_t LaunchMatMul(const MatMulParams& p, cudaStream_t stream) {
  const int64_t xs = p.x_row_stride ? p.x_row_stride : p.w.cols;
  const int64_t ys = p.y_row_stride ? p.y_row_stride : p.w.rows;
  dim3 grid(static_cast<unsigned>((p.w.rows + kTileN - 1) / kTileN),
            static_cast<unsigned>((p.num_tokens + kTileT - 1) / kTileT));
  if (p.act_dtype == ActDType::kF32) {
    MatMulKernel<float><<<grid, kThreads, 0, stream>>>(
        p.w, static_cast<const float*>(p.x), xs, static_cast<float*>(p.y), ys, p.num_tokens, p.bias);
  } else {
    MatMulKernel<uint16_t><<<grid, kThreads, 0, stream>>>(
        p.w, static_cast<const uint16_t*>(p.x), xs, static_cast<uint16_t*>(p.y), ys, p.num_tokens,
        p.bias);
  }
  return cudaGetLastError();
}

}  // namespace moeshard::gpu
