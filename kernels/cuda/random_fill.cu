// Device-side synthetic weights (gpu_params.h FillParams): SplitMix64 of (seed, index).
#include <algorithm>

#include "common/splitmix64.h"
#include "kernels/cuda/act.cuh"
#include "kernels/cuda/launchers.h"

namespace moeshard::gpu {
namespace {

__global__ void FillKernel(FillParams p) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < p.count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = SplitMix64(p.seed * 0x100000001B3ull + static_cast<uint64_t>(i));
    const float u = static_cast<float>(h >> 40) * (2.f / 16777216.f) - 1.f;
    switch (p.kind) {
      case FillKind::kRandomBytes: static_cast<uint8_t*>(p.dst)[i] = static_cast<uint8_t>(h); break;
      case FillKind::kUniformF32: static_cast<float*>(p.dst)[i] = p.scale * u; break;
      case FillKind::kUniformBf16: static_cast<uint16_t*>(p.dst)[i] = DevF32ToBf16(p.scale * u); break;
      case FillKind::kConstF32: static_cast<float*>(p.dst)[i] = p.scale; break;
      case FillKind::kStridedU16: {
        uint8_t* b = static_cast<uint8_t*>(p.dst) + i * p.stride;
        b[0] = static_cast<uint8_t>(p.pattern);
        b[1] = static_cast<uint8_t>(p.pattern >> 8);
        break;
      }
      case FillKind::kStridedU8: static_cast<uint8_t*>(p.dst)[i * p.stride] = static_cast<uint8_t>(p.pattern); break;
    }
  }
}

}  // namespace

cudaError_t LaunchFill(const FillParams& p, cudaStream_t st) {
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((p.count + 255) / 256, 65536));
  FillKernel<<<grid, 256, 0, st>>>(p);
  return cudaGetLastError();
}

}  // namespace moeshard::gpu
