#include "worker/gpu/expert_repack.h"

#include <cstdlib>
#include <cstring>

#include "common/status.h"
#include "kernels/moe/moe_expert.h"

namespace moeshard::gpu {
namespace {

bool EnvOff(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "0") == 0;
}

}  // namespace

bool MayRepackExperts(WeightFormat format, int64_t width, int64_t inter, ActDType act, RepackPolicy policy) {
  if (act != ActDType::kBF16 || width % 256 != 0 || inter % 256 != 0 || EnvOff("MOESHARD_MOE_REPACK")) return false;
  return (format == WeightFormat::kNVFP4 && policy.nvfp4) || (format == WeightFormat::kMXFP4 && policy.mxfp4) ||
         (format == WeightFormat::kQ8_0 && policy.q8);
}

absl::StatusOr<bool> WantRepackExperts(const std::vector<MoeExpertWeights>& ex, int64_t width, int64_t inter,
                                       ActDType act, RepackPolicy policy, GpuStream stream) {
  if (ex.empty() || !MayRepackExperts(ex[0].gate.format, width, inter, act, policy)) return false;
  const WeightFormat f = ex[0].gate.format;
  std::vector<WeightRef> mx;  // MXFP4: every view, their scales checked in one pass
  for (const MoeExpertWeights& e : ex) {
    if (e.gate.format != f || e.up.format != f || e.down.format != f) return false;
    if (f == WeightFormat::kNVFP4) {
      if (!MoeNvfp4Eligible(e, width, inter)) return false;
      continue;
    }
    if (e.gate.rows != inter || e.gate.cols != width || e.up.rows != inter || e.up.cols != width ||
        e.down.rows != width || e.down.cols != inter) {
      return false;
    }
    if (f == WeightFormat::kQ8_0) {  // every scale and code is copied as it is: the shape decides
      if (!MoeQ8Repackable(e.gate) || !MoeQ8Repackable(e.up) || !MoeQ8Repackable(e.down)) return false;
      continue;
    }
    mx.insert(mx.end(), {e.gate, e.up, e.down});
  }
  if (mx.empty()) return true;
  return MoeMxfp4Repackable(mx.data(), static_cast<int>(mx.size()), stream);
}

absl::StatusOr<uint32_t> RepackExperts(std::vector<MoeExpertWeights>& ex, DevicePool& pool, GpuStream stream) {
  const WeightFormat f = ex.empty() ? WeightFormat::kNVFP4 : ex[0].gate.format;
  for (MoeExpertWeights& e : ex) {
    for (WeightRef* w : {&e.gate, &e.up, &e.down}) {
      // Codes: 4 bits a weight (8 for Q8_0); scales: one byte per 16 weights (Q8_0: 2 per 32;
      // MXFP4: 1 per 32).
      const int code_bits = f == WeightFormat::kQ8_0 ? 8 : 4, scale_div = f == WeightFormat::kMXFP4 ? 32 : 16;
      ASSIGN_OR_RETURN(void* data, pool.Alloc(static_cast<size_t>(w->rows * w->cols * code_bits / 8)));
      ASSIGN_OR_RETURN(void* scale, pool.Alloc(static_cast<size_t>(w->rows * w->cols / scale_div)));
      if (f == WeightFormat::kMXFP4) {
        ASSIGN_OR_RETURN(*w, MoeRepackMxfp4(*w, data, scale, stream));
      } else if (f == WeightFormat::kQ8_0) {
        ASSIGN_OR_RETURN(*w, MoeRepackQ8(*w, data, scale, stream));
      } else {
        ASSIGN_OR_RETURN(*w, MoeRepackNvfp4(*w, data, scale, stream));
      }
    }
  }
  if (f == WeightFormat::kMXFP4) return kMoeNvfp4Repacked | kMoeMxfp4Repacked;
  if (f == WeightFormat::kQ8_0) return kMoeNvfp4Repacked | kMoeQ8Repacked;
  return kMoeNvfp4Repacked;
}

}  // namespace moeshard::gpu
