// Device fills and the cuBLAS baseline's glue kernels (see moe_expert_baseline.h).
#include <algorithm>

#include "bench/moe_expert_baseline.h"
#include "common/splitmix64.h"
#include "kernels/cuda/weight_decode.cuh"

namespace moeshard::bench {
namespace {

__global__ void FillBytesKernel(uint8_t* p, size_t n, uint64_t seed, bool scale) {
  for (size_t i = (blockIdx.x * size_t{blockDim.x} + threadIdx.x) * 8; i < n; i += size_t{gridDim.x} * blockDim.x * 8) {
    uint64_t v = SplitMix64(seed ^ (i * 0x2545f4914f6cdd1dull));
    for (int j = 0; j < 8 && i + j < n; ++j) {
      uint8_t b = static_cast<uint8_t>(v >> (8 * j));
      p[i + j] = scale ? static_cast<uint8_t>((6 << 3) | (b & 7)) : b;
    }
  }
}

__global__ void SaneWeightsKernel(uint8_t* p, size_t bytes, WeightFormat f) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  const size_t i0 = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (f == WeightFormat::kQ8_0) {
    for (size_t b = i0; b < bytes / 34; b += stride) p[34 * b + 1] = static_cast<uint8_t>(0x0C | (p[34 * b + 1] & 3));
  } else if (f == WeightFormat::kMXFP4) {
    for (size_t b = i0; b < bytes / 17; b += stride) p[17 * b] = static_cast<uint8_t>(120 + (p[17 * b] & 1));
  } else if (f == WeightFormat::kBF16) {
    uint16_t* q = reinterpret_cast<uint16_t*>(p);
    for (size_t j = i0; j < bytes / 2; j += stride) {
      const uint16_t r = q[j];
      q[j] = static_cast<uint16_t>((r & 0x807F) | ((120 + ((r >> 7) & 1)) << 7));
    }
  }
}

__global__ void FillBf16Kernel(uint16_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint64_t v = SplitMix64(seed ^ (i * 0x2545f4914f6cdd1dull));
    float u = static_cast<float>(v >> 40) * 0x1p-24f;  // [0, 1)
    p[i] = gpu::DevF32ToBf16(4.f * u - 2.f);
  }
}

__global__ void GatherKernel(const uint16_t* x, const int32_t* rows, int64_t num_rows, int top_k, int64_t L,
                             uint16_t* xg) {
  for (int64_t r = blockIdx.x; r < num_rows; r += gridDim.x) {
    const uint4* src = reinterpret_cast<const uint4*>(x + (rows[r] / top_k) * L);
    uint4* dst = reinterpret_cast<uint4*>(xg + r * L);
    for (int64_t i = threadIdx.x; i < L / 8; i += blockDim.x) dst[i] = src[i];
  }
}

__global__ void SiluMulKernel(const uint16_t* gu, int64_t num_rows, int64_t I, uint16_t* h) {
  const int64_t n = num_rows * I;
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n; j += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = j / I, i = j % I;
    const float g = gpu::DevBf16ToF32(gu[r * 2 * I + i]), u = gpu::DevBf16ToF32(gu[r * 2 * I + I + i]);
    h[j] = gpu::DevF32ToBf16(g / (1.f + expf(-g)) * u);
  }
}

}  // namespace

void FillRandomBytes(uint8_t* p, size_t n, uint64_t seed, bool e4m3_scale, gpu::GpuStream s) {
  FillBytesKernel<<<2048, 256, 0, s>>>(p, n, seed, e4m3_scale);
}

void SaneWeights(uint8_t* p, size_t bytes, WeightFormat f, gpu::GpuStream s) {
  SaneWeightsKernel<<<2048, 256, 0, s>>>(p, bytes, f);
}

void FillRandomBf16(uint16_t* p, size_t n, uint64_t seed, gpu::GpuStream s) {
  FillBf16Kernel<<<2048, 256, 0, s>>>(p, n, seed);
}

void GatherRows(const uint16_t* x, const int32_t* rows, int64_t num_rows, int top_k, int64_t L, uint16_t* xg,
                gpu::GpuStream s) {
  if (num_rows > 0)
    GatherKernel<<<static_cast<unsigned>(std::min<int64_t>(num_rows, 4096)), 128, 0, s>>>(x, rows, num_rows, top_k, L,
                                                                                          xg);
}

void SiluMul(const uint16_t* gu, int64_t num_rows, int64_t I, uint16_t* h, gpu::GpuStream s) {
  if (num_rows > 0) SiluMulKernel<<<2048, 256, 0, s>>>(gu, num_rows, I, h);
}

}  // namespace moeshard::bench
