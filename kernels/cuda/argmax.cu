// ArgMaxRows (gpu_params.h): the greedy token of each row of fp32 logits on the device, so that
// a greedy step brings back one id a row instead of the row (600 KB for a 151,936-word
// vocabulary). The definition is worker/sampler.h's ArgMax: the first index of the largest
// value, NaN never wins, a NaN at index 0 gives 0 (a scan that moves only on a strictly larger
// value). Two launches: kSplits blocks a row each reduce a contiguous slice to (value, index),
// then one warp a row reduces the slices in order.
#include <cmath>

#include "kernels/cuda/launchers.h"

namespace moeshard::gpu {
namespace {

constexpr int kSplits = kArgMaxSplits, kThreads = 256;

// Whether (v, i) comes before (bv, bi): larger, then smaller index; NaN never does.
__device__ __forceinline__ bool Before(float v, int64_t i, float bv, int64_t bi) {
  return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ void WarpBest(float& v, int64_t& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (Before(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

__global__ void __launch_bounds__(kThreads) ArgMaxPartialKernel(ArgMaxParams p) {
  __shared__ float sv[kThreads / 32];
  __shared__ int64_t si[kThreads / 32];
  const int64_t row = blockIdx.y, V = p.vocab;
  const float* l = p.logits + row * V;
  const int64_t per = (V + kSplits - 1) / kSplits;
  const int64_t b = blockIdx.x * per, e = min(V, b + per);
  float bv = -INFINITY;
  int64_t bi = V;  // nothing yet: any non-NaN value (-inf too) comes before it
  for (int64_t i = b + threadIdx.x; i < e; i += kThreads) {
    const float v = l[i];
    if (Before(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  }
  WarpBest(bv, bi);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  if (warp == 0) {
    bv = lane < kThreads / 32 ? sv[lane] : -INFINITY;
    bi = lane < kThreads / 32 ? si[lane] : V;
    WarpBest(bv, bi);
    if (lane == 0) {
      p.partial_value[row * kSplits + blockIdx.x] = bv;
      p.partial_index[row * kSplits + blockIdx.x] = bi;
    }
  }
}

__global__ void __launch_bounds__(32) ArgMaxFinalKernel(ArgMaxParams p) {
  const int64_t row = blockIdx.x, V = p.vocab;
  const int lane = threadIdx.x;
  float bv = p.partial_value[row * kSplits + lane];
  int64_t bi = p.partial_index[row * kSplits + lane];
  WarpBest(bv, bi);
  if (lane == 0) p.out[row] = isnan(p.logits[row * V]) || bi >= V ? 0 : static_cast<int32_t>(bi);
}

static_assert(kSplits == 32, "one warp reduces the slices");

}  // namespace

int64_t ArgMaxScratchBytes(int64_t rows) { return rows * kSplits * (sizeof(float) + sizeof(int64_t)); }

cudaError_t LaunchArgMax(const ArgMaxParams& p, cudaStream_t st) {
  ArgMaxPartialKernel<<<dim3(kSplits, static_cast<unsigned>(p.rows)), kThreads, 0, st>>>(p);
  ArgMaxFinalKernel<<<static_cast<unsigned>(p.rows), 32, 0, st>>>(p);
  return cudaGetLastError();
}

}  // namespace moeshard::gpu
