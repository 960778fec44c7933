// The streaming kernels (moe_stream.cuh) for int8 codes: Q8_0 experts repacked by MoeRepackQ8
// into the layout of moe_q8_stream_layout.h, and the repack itself.
#include <algorithm>

#include "kernels/moe/moe_stream.cuh"

namespace moeshard::gpu {
namespace {

constexpr int kChunkGroups = kQ8StreamSliceBytes / 4;

// One thread a stored group of 4 codes (moe_q8_stream_layout.h Q8StreamRepackGroup).
__global__ void RepackQ8Kernel(WeightRef src, uint8_t* dst_data, uint8_t* dst_scale) {
  const int64_t groups = src.rows * src.cols / 4;
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < groups; o += int64_t{gridDim.x} * blockDim.x) {
    Q8StreamRepackGroup(src, o / kChunkGroups, static_cast<int>(o % kChunkGroups), dst_data, dst_scale);
  }
}

}  // namespace

bool MoeRepackQ8Eligible(const WeightRef& w) {
  return w.format == WeightFormat::kQ8_0 && w.rows > 0 && w.rows % 16 == 0 && w.cols > 0 &&
         w.cols % kQ8StreamCols == 0 && w.col_offset >= 0 && w.col_offset % 32 == 0 && w.data;
}

cudaError_t LaunchMoeRepackQ8(const WeightRef& src, void* dst_data, void* dst_scale, cudaStream_t stream) {
  const int64_t words = src.rows * src.cols / 4;
  const int64_t blocks = std::min<int64_t>((words + 255) / 256, 4096);
  RepackQ8Kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(src, static_cast<uint8_t*>(dst_data),
                                                                    static_cast<uint8_t*>(dst_scale));
  return cudaGetLastError();
}

cudaError_t LaunchMoeStreamQ8GateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return moe_stream::LaunchStreamGateUp<true>(p, w, stream);
}

cudaError_t LaunchMoeStreamQ8Down(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return moe_stream::LaunchStreamDown<true>(p, w, stream);
}

}  // namespace moeshard::gpu
