#include "kernels/cuda/cuda_check.h"

#include "absl/strings/str_cat.h"

namespace moeshard::gpu {

absl::Status CudaStatus(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(call, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

}  // namespace moeshard::gpu
