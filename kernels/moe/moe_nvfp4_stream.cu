// The streaming kernels (moe_stream.cuh) for e2m1 codes: NVFP4 and MXFP4 experts repacked by
// MoeRepackNvfp4 / MoeRepackMxfp4, the repack itself and the MXFP4 scale-range check.
#include <algorithm>

#include "kernels/moe/moe_stream.cuh"

namespace moeshard::gpu {
namespace {

using moe_stream::kKc;

// One thread a repacked word (and a lane's scale word); kMx: from MXFP4's 17-byte blocks
// (moe_stream_decode.h E2m1RepackWord).
template <bool kMx>
__global__ void RepackKernel(WeightRef src, uint8_t* dst_data, uint8_t* dst_scale) {
  const int64_t words = src.rows * src.cols / 8;
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < words; o += int64_t{gridDim.x} * blockDim.x) {
    E2m1RepackWord<kMx>(src, o, reinterpret_cast<uint32_t*>(dst_data), reinterpret_cast<uint32_t*>(dst_scale));
  }
}

// Sets *bad when a block scale of the view lies outside [3, 136] (the MXFP4 repack's exact range).
__global__ void MxScaleRangeKernel(WeightRef src, int* bad) {
  const int64_t per_row = src.cols / 32, n = src.rows * per_row;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / per_row, b = i % per_row;
    const uint32_t e = src.data[r * src.row_stride_bytes + (src.col_offset / 32 + b) * 17];
    if (e < 3 || e > 136) atomicOr(bad, 1);
  }
}

}  // namespace

bool MoeRepackMxfp4Eligible(const WeightRef& w) {
  return w.format == WeightFormat::kMXFP4 && w.rows > 0 && w.rows % 16 == 0 && w.cols > 0 && w.cols % kKc == 0 &&
         w.col_offset % 32 == 0 && w.data;
}

cudaError_t LaunchMoeMxfp4ScaleCheck(const WeightRef& src, int* bad, cudaStream_t stream) {
  const int64_t n = src.rows * (src.cols / 32);
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, 1024));
  MxScaleRangeKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(src, bad);
  return cudaGetLastError();
}

cudaError_t LaunchMoeRepackMxfp4(const WeightRef& src, void* dst_data, void* dst_scale, cudaStream_t stream) {
  const int64_t words = src.rows * src.cols / 8;
  const int64_t blocks = std::min<int64_t>((words + 255) / 256, 4096);
  RepackKernel<true><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(src, static_cast<uint8_t*>(dst_data),
                                                                        static_cast<uint8_t*>(dst_scale));
  return cudaGetLastError();
}

bool MoeRepackNvfp4Eligible(const WeightRef& w) {
  return w.format == WeightFormat::kNVFP4 && w.rows > 0 && w.rows % 16 == 0 && w.cols > 0 && w.cols % kKc == 0 &&
         w.col_offset % 16 == 0 && w.data && w.scale;
}

cudaError_t LaunchMoeRepackNvfp4(const WeightRef& src, void* dst_data, void* dst_scale, cudaStream_t stream) {
  const int64_t words = src.rows * src.cols / 8;
  const int64_t blocks = std::min<int64_t>((words + 255) / 256, 4096);
  RepackKernel<false><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(src, static_cast<uint8_t*>(dst_data),
                                                                         static_cast<uint8_t*>(dst_scale));
  return cudaGetLastError();
}

cudaError_t LaunchMoeStreamGateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return w.stream_q8 ? LaunchMoeStreamQ8GateUp(p, w, stream) : moe_stream::LaunchStreamGateUp<false>(p, w, stream);
}

cudaError_t LaunchMoeStreamDown(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return w.stream_q8 ? LaunchMoeStreamQ8Down(p, w, stream) : moe_stream::LaunchStreamDown<false>(p, w, stream);
}

}  // namespace moeshard::gpu
