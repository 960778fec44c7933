// CUDA runtime errors as absl::Status naming the failed call. Internal to the CUDA backend:
// include only from kernels/cuda sources and GPU tests (it pulls in cuda_runtime.h).
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace moeshard::gpu {

// OkStatus for cudaSuccess, else Internal("<call>: <error name>: <error string>").
absl::Status CudaStatus(cudaError_t err, const char* call);

}  // namespace moeshard::gpu

#define MOESHARD_CUDA_RETURN_IF_ERROR(expr)                                       \
  do {                                                                            \
    if (cudaError_t moeshard_cuda_err_ = (expr); moeshard_cuda_err_ != cudaSuccess) \
      return ::moeshard::gpu::CudaStatus(moeshard_cuda_err_, #expr);              \
  } while (0)
