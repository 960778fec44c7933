// Internal: the kernel launchers defined in the .cu files, called by gpu_ops.cc after it
// has validated the params. Each returns the launch error (cudaGetLastError).
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/gpu_params.h"

namespace moeshard::gpu {

cudaError_t LaunchExpand(const ExpandParams& p, cudaStream_t stream);
cudaError_t LaunchMatMul(const MatMulParams& p, cudaStream_t stream);

}  // namespace moeshard::gpu
