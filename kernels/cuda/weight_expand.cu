// Weight expansion: one thread per output element, a 2-D grid of (column chunk, row).
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/weight_decode.cuh"

namespace moeshard::gpu {
namespace {

constexpr int kThreads = 256;

template <typename Out>
__global__ void ExpandKernel(WeightRef w, Out* out, int64_t out_row_stride) {
  const int64_t row = blockIdx.y;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (col >= w.cols) return;
  float v = DecodeWeight(w, row, col);
  if constexpr (sizeof(Out) == 4) {
    out[row * out_row_stride + col] = v;
  } else {
    out[row * out_row_stride + col] = DevF32ToBf16(v);
  }
}

}  // namespace

cudaError_t LaunchExpand(const ExpandParams& p, cudaStream_t stream) {
  const int64_t stride = p.out_row_stride ? p.out_row_stride : p.w.cols;
  dim3 grid(static_cast<unsigned>((p.w.cols + kThreads - 1) / kThreads), static_cast<unsigned>(p.w.rows));
  if (p.out_dtype == ActDType::kF32) {
    ExpandKernel<float><<<grid, kThreads, 0, stream>>>(p.w, static_cast<float*>(p.out), stride);
  } else {
    ExpandKernel<uint16_t><<<grid, kThreads, 0, stream>>>(p.w, static_cast<uint16_t*>(p.out), stride);
  }
  return cudaGetLastError();
}

}  // namespace moeshard::gpu
