// Dense projections through cuBLAS: y[T, N] = x[T, K] · Wᵀ with W [N, K] row-major on the
// device in the activation dtype (expanded once at load), or kept as split Q8 (gemv.h: int8
// codes + f16 scales; then `q8_scales` is set, `dtype` is the activation dtype, and Run expands
// row chunks into the caller's scratch before each cuBLAS call). bf16 inputs accumulate in fp32
// and may write bf16 or fp32 outputs; fp32 uses CUBLAS_COMPUTE_32F_PEDANTIC (no TF32).
// Decode-sized calls (≤ kGemvMaxTokens rows) go to Gemv instead: see DenseProject.
// One Gemm per stream; not thread-safe.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cuda/gpu_params.h"

namespace moeshard::gpu {

struct DenseWeight {
  const void* data = nullptr;  // device, [rows, cols] contiguous (int8 codes when q8_scales is set)
  ActDType dtype = ActDType::kF32;
  int64_t rows = 0, cols = 0;
  const uint16_t* q8_scales = nullptr;  // split Q8: f16 [rows, cols / 32]
};

struct GemmArgs {
  DenseWeight w;
  const void* x = nullptr;
  ActDType x_dtype = ActDType::kF32;  // must equal w.dtype
  int64_t x_stride = 0;               // elements; 0 means w.cols
  void* y = nullptr;
  ActDType y_dtype = ActDType::kF32;
  int64_t y_stride = 0;               // elements; 0 means w.rows
  int64_t num_tokens = 0;
  void* scratch = nullptr;  // split-Q8 weights only: where row chunks are expanded
  size_t scratch_bytes = 0;
};

class Gemm {
 public:
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(GpuStream stream);
  ~Gemm();
  absl::Status Run(const GemmArgs& a);

 private:
  Gemm() = default;
  absl::Status RunDense(const GemmArgs& a, const void* w, int64_t rows, void* y);
  absl::Status RunSplitQ8(const GemmArgs& a);
  void* handle_ = nullptr;  // cublasHandle_t
  GpuStream stream_ = nullptr;
};

}  // namespace moeshard::gpu
