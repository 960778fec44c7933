#include "kernels/cuda/gemm.h"

#include <cublas_v2.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/gemv.h"

namespace moeshard::gpu {
namespace {

absl::Status CublasStatus(cublasStatus_t st, const char* call) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", cublasGetStatusName(st), ": ", cublasGetStatusString(st)));
}

cudaDataType_t CudaType(ActDType t) { return t == ActDType::kF32 ? CUDA_R_32F : CUDA_R_16BF; }

}  // namespace

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(GpuStream stream) {
  std::unique_ptr<Gemm> g(new Gemm());
  cublasHandle_t h;
  if (absl::Status s = CublasStatus(cublasCreate(&h), "cublasCreate"); !s.ok()) return s;
  g->handle_ = h;
  g->stream_ = stream;
  if (absl::Status s = CublasStatus(cublasSetStream(h, stream), "cublasSetStream"); !s.ok()) return s;
  return g;
}

Gemm::~Gemm() {
  if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

absl::Status Gemm::Run(const GemmArgs& a) {
  if (a.num_tokens <= 0) return absl::OkStatus();
  if (!a.w.data || !a.x || !a.y) return absl::InvalidArgumentError("Gemm: missing weight, input or output");
  if (a.x_dtype != a.w.dtype) return absl::InvalidArgumentError("Gemm: input and weight dtypes differ");
  if (a.w.dtype == ActDType::kF32 && a.y_dtype != ActDType::kF32) {
    return absl::InvalidArgumentError("Gemm: fp32 weights write fp32 outputs");
  }
  if (a.w.q8_scales) return RunSplitQ8(a);
  return RunDense(a, a.w.data, a.w.rows, a.y);
}

absl::Status Gemm::RunDense(const GemmArgs& a, const void* w, int64_t rows, void* y) {
  const float alpha = 1.f, beta = 0.f;
  const int64_t lda = a.w.cols, ldb = a.x_stride ? a.x_stride : a.w.cols, ldc = a.y_stride ? a.y_stride : a.w.rows;
  // Column-major view: yᵀ [N, T] = W [N, K] (stored as Kᵀ-major, so op T) · xᵀ [K, T].
  const cublasComputeType_t compute =
      a.w.dtype == ActDType::kF32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  return CublasStatus(
      cublasGemmEx(static_cast<cublasHandle_t>(handle_), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows),
                   static_cast<int>(a.num_tokens), static_cast<int>(a.w.cols), &alpha, w, CudaType(a.w.dtype),
                   static_cast<int>(lda), a.x, CudaType(a.x_dtype), static_cast<int>(ldb), &beta, y,
                   CudaType(a.y_dtype), static_cast<int>(ldc), compute, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

// Split-Q8 weights: rows in chunks that fit the scratch, each expanded to the activation dtype
// (exactly ExpandWeights' values) and multiplied into its columns of y.
absl::Status Gemm::RunSplitQ8(const GemmArgs& a) {
  const size_t elem = a.w.dtype == ActDType::kF32 ? 4 : 2;
  const int64_t chunk = static_cast<int64_t>(a.scratch_bytes / (elem * a.w.cols));
  if (!a.scratch || chunk < 1) return absl::InvalidArgumentError("Gemm: split-Q8 weights need an expansion scratch");
  const int8_t* codes = static_cast<const int8_t*>(a.w.data);
  const size_t y_elem = a.y_dtype == ActDType::kF32 ? 4 : 2;
  for (int64_t r0 = 0; r0 < a.w.rows; r0 += chunk) {
    const int64_t n = std::min(chunk, a.w.rows - r0);
    RETURN_IF_ERROR(GemvExpandQ8(codes + r0 * a.w.cols, a.w.q8_scales + r0 * (a.w.cols / 32), n, a.w.cols, a.scratch,
                                 a.w.dtype, stream_));
    RETURN_IF_ERROR(RunDense(a, a.scratch, n, static_cast<char*>(a.y) + r0 * y_elem));
  }
  return absl::OkStatus();
}

}  // namespace moeshard::gpu
