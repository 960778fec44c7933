// Gemv's validation and token grouping (the kernels are in gemv.cu).
#include "kernels/cuda/gemv.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv_launch.h"

namespace moeshard::gpu {
namespace {

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool GemvSupports(GemvWeight wtype, int64_t cols) {
  return cols > 0 && cols % (wtype == GemvWeight::kQ8 ? 32 : 16) == 0 && GemvTokensPerLaunch(cols) >= 1 &&
         cols * 4 <= kGemvMaxSmemBytes;
}

bool GemvOneLaunch(int64_t cols, int64_t tokens) { return tokens <= GemvTokensPerLaunch(cols); }

namespace {

// Tokens of one launch: what the tensor-core kernel takes for split Q8 weights and bf16 x (gemv.h),
// else (or with MOESHARD_GEMV_MMA_GROUP8=0) what fp32 x in shared memory allows.
int64_t LaunchTokens(GemvWeight wtype, bool x_f32, int64_t cols) {
  static const bool group8 = [] {
    const char* v = std::getenv("MOESHARD_GEMV_MMA_GROUP8");
    return !(v && v[0] == '0');
  }();
  const int64_t fp32 = GemvTokensPerLaunch(cols);
  if (!group8 || wtype != GemvWeight::kQ8 || x_f32 || !GemvMmaOn()) return fp32;
  return std::max<int64_t>(fp32, GemvMmaTokensPerLaunch(cols));
}

}  // namespace

bool GemvOneLaunch(GemvWeight wtype, ActDType x_dtype, int64_t cols, int64_t tokens) {
  return tokens <= LaunchTokens(wtype, x_dtype == ActDType::kF32, cols);
}

absl::Status Gemv(const GemvParams& p, GpuStream stream) {
  if (p.num_tokens <= 0) return absl::OkStatus();
  bool wide = !p.res.s && GemvWideTakes(p.wtype, p.x_dtype == ActDType::kF32, p.cols, p.num_tokens);
  if (p.num_tokens > kGemvMaxTokens && !wide) {
    return absl::InvalidArgumentError(absl::StrCat("Gemv: ", p.num_tokens, " tokens, at most ", kGemvMaxTokens, " (",
                                                   kGemvWideMaxTokens, " of split Q8 with bf16 x, K % 64 == 0)"));
  }
  if (!GemvSupports(p.wtype, p.cols)) return absl::InvalidArgumentError(absl::StrCat("Gemv: unsupported K = ", p.cols));
  if (p.num_matrices < 1 || p.num_matrices > 3) return absl::InvalidArgumentError("Gemv: 1 to 3 matrices");
  const bool res = p.res.s != nullptr;
  const int64_t x_stride = res ? p.cols : (p.x_stride ? p.x_stride : p.cols);
  const size_t x_elem = res || p.x_dtype == ActDType::kF32 ? 4 : 2;
  if (res) {
    if (!p.res.norm || !Aligned16(p.res.s) || (p.res.add && !Aligned16(p.res.add)) || !Aligned16(p.res.norm) ||
        (p.res.xn && !Aligned16(p.res.xn)) || p.cols % 4 != 0) {
      return absl::InvalidArgumentError(
          "Gemv: the residual input needs s and norm (and add when given), 16-byte aligned, K % 4 == 0");
    }
  } else if (!p.x || !Aligned16(p.x) || (x_stride * x_elem) % 16 != 0 || x_stride < p.cols) {
    return absl::InvalidArgumentError("Gemv: x must be 16-byte aligned with a 16-byte row stride >= K");
  }
  GemvLaunch a;
  a.wtype = p.wtype;
  a.x_f32 = res || p.x_dtype == ActDType::kF32;
  a.x_stride = x_stride;
  a.y_f32 = p.y_dtype == ActDType::kF32;
  a.cols = p.cols;
  a.num_matrices = p.num_matrices;
  const int rpt = GemvRowsPerTask(p.wtype, p.cols, std::min<int64_t>(p.num_tokens, GemvTokensPerLaunch(p.cols)));
  a.rows_per_task = rpt;
  for (int i = 0; i < p.num_matrices; ++i) {
    GemvMatrix m = p.m[i];
    if (!m.w || !m.y || m.rows <= 0 || !Aligned16(m.w) || (p.wtype == GemvWeight::kQ8 && !m.scales)) {
      return absl::InvalidArgumentError(absl::StrCat("Gemv: matrix ", i, " lacks weights, scales or output"));
    }
    if (m.y_stride == 0) m.y_stride = m.rows;
    if (m.y_stride < m.rows) return absl::InvalidArgumentError("Gemv: y_stride < rows");
    a.m[i] = m;
    a.task_begin[i + 1] = a.task_begin[i] + (m.rows + rpt - 1) / rpt;
  }
  for (int i = 0; i < p.num_matrices && wide; ++i) wide = reinterpret_cast<uintptr_t>(a.m[i].scales) % 4 == 0;
  if (wide) {  // else the groups below (each reads the weights again)
    a.num_tokens = static_cast<int>(p.num_tokens);
    a.x = p.x;
    MOESHARD_CUDA_RETURN_IF_ERROR(LaunchGemvQ8Wide(a, stream));
    return absl::OkStatus();
  }
  const int64_t group = LaunchTokens(a.wtype, a.x_f32 != 0, p.cols);
  const size_t y_elem = a.y_f32 ? 4 : 2;
  for (int64_t t0 = 0; t0 < p.num_tokens; t0 += group) {
    GemvLaunch g = a;
    g.num_tokens = static_cast<int>(std::min<int64_t>(group, p.num_tokens - t0));
    g.x = res ? nullptr : static_cast<const char*>(p.x) + t0 * x_stride * x_elem;
    if (res) {
      g.res = p.res;
      g.res.s += t0 * p.cols;
      if (g.res.add) g.res.add += t0 * p.cols;
      if (g.res.xn) g.res.xn = static_cast<char*>(g.res.xn) + t0 * p.cols * (p.res.xn_dtype == ActDType::kF32 ? 4 : 2);
    }
    for (int i = 0; i < p.num_matrices; ++i) g.m[i].y = static_cast<char*>(a.m[i].y) + t0 * a.m[i].y_stride * y_elem;
    MOESHARD_CUDA_RETURN_IF_ERROR(LaunchGemv(g, stream));
  }
  return absl::OkStatus();
}

absl::Status GemvSplitQ8(const WeightRef& w, int8_t* codes, uint16_t* scales, GpuStream stream) {
  if (w.format != WeightFormat::kQ8_0 || !w.valid() || w.cols % 32 != 0 || w.col_offset % 32 != 0) {
    return absl::InvalidArgumentError("GemvSplitQ8: needs a Q8_0 view of whole blocks");
  }
  if (!codes || !scales || !Aligned16(codes)) return absl::InvalidArgumentError("GemvSplitQ8: bad destination");
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchGemvSplitQ8(w, codes, scales, stream));
  return absl::OkStatus();
}

absl::Status GemvExpandQ8(const int8_t* codes, const uint16_t* scales, int64_t rows, int64_t cols, void* out,
                          ActDType out_dtype, GpuStream stream) {
  if (!codes || !scales || !out || rows <= 0 || cols % 32 != 0 || reinterpret_cast<uintptr_t>(codes) % 8 != 0 ||
      !Aligned16(out)) {
    return absl::InvalidArgumentError(
        "GemvExpandQ8: bad arguments (codes 8-byte and out 16-byte aligned, K % 32 == 0)");
  }
  MOESHARD_CUDA_RETURN_IF_ERROR(
      LaunchGemvExpandQ8(codes, scales, rows * cols, out, out_dtype == ActDType::kF32, stream));
  return absl::OkStatus();
}

}  // namespace moeshard::gpu
