// Validation of the kernel params, then the launch, with CUDA errors as statuses.
#include "kernels/cuda/gpu_ops.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launchers.h"

namespace moeshard::gpu {
namespace {

constexpr int64_t kMaxGridY = 65535;

absl::Status CheckWeight(const WeightRef& w) {
  if (!w.valid()) return absl::InvalidArgumentError("weight view is empty or has no data");
  if (w.row_stride_bytes <= 0 || w.col_offset < 0) {
    return absl::InvalidArgumentError("weight view needs a positive row stride and offset >= 0");
  }
  if (w.format == WeightFormat::kNVFP4 && (w.scale == nullptr || w.scale_row_stride <= 0)) {
    return absl::InvalidArgumentError("nvfp4 weights need block scales");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ExpandWeights(const ExpandParams& p, GpuStream stream) {
  if (absl::Status s = CheckWeight(p.w); !s.ok()) return s;
  if (p.out == nullptr) return absl::InvalidArgumentError("ExpandWeights: no output");
  if (p.w.rows > kMaxGridY) {
    return absl::InvalidArgumentError(absl::StrCat("ExpandWeights: more than ", kMaxGridY, " rows"));
  }
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchExpand(p, stream));
  return absl::OkStatus();
}

absl::Status MatMul(const MatMulParams& p, GpuStream stream) {
  if (absl::Status s = CheckWeight(p.w); !s.ok()) return s;
  if (p.num_tokens <= 0) return absl::OkStatus();
  if (p.x == nullptr || p.y == nullptr) return absl::InvalidArgumentError("MatMul: no x or y");
  if (p.num_tokens > 32 * kMaxGridY) {
    return absl::InvalidArgumentError(absl::StrCat("MatMul: too many tokens: ", p.num_tokens));
  }
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchMatMul(p, stream));
  return absl::OkStatus();
}

}  // namespace moeshard::gpu
