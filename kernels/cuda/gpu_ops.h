// Host entry points of the CUDA kernels. Each call validates its params, enqueues work on
// `stream` and returns without synchronizing; errors name the CUDA call that failed.
// Thread-safe as far as the stream is: callers serialize work on one stream themselves.
#pragma once

#include "absl/status/status.h"
#include "kernels/cuda/gpu_params.h"

namespace moeshard::gpu {

// Row expansion of stored weights: bit-exact with kernels/cpu/dequant.h DequantRow in fp32.
absl::Status ExpandWeights(const ExpandParams& p, GpuStream stream);

// Tiled matmul that reads weights in their stored format and expands them on chip.
absl::Status MatMul(const MatMulParams& p, GpuStream stream);

}  // namespace moeshard::gpu
