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
  return (format == WeightFormat::kNVFP4 && policy.nvfp4) || (format == WeightFormat::kMXFP4 && policy.mxfp4);
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
    mx.insert(mx.end(), {e.gate, e.up, e.down});
  }
  if (mx.empty()) return true;
  return MoeMxfp4Repackable(mx.data(), static_cast<int>(mx.size()), stream);
}

absl::StatusOr<uint32_t> RepackExperts(std::vector<MoeExpertWeights>& ex, DevicePool& pool, GpuStream stream) {
  const bool mx = !ex.empty() && ex[0].gate.format == WeightFormat::kMXFP4;
  for (MoeExpertWeights& e : ex) {
    for (WeightRef* w : {&e.gate, &e.up, &e.down}) {
      ASSIGN_OR_RETURN(void* data, pool.Alloc(static_cast<size_t>(w->rows * w->cols / 2)));
      ASSIGN_OR_RETURN(void* scale, pool.Alloc(static_cast<size_t>(w->rows * w->cols / 16)));
      if (mx) {
        ASSIGN_OR_RETURN(*w, MoeRepackMxfp4(*w, data, scale, stream));
      } else {
        ASSIGN_OR_RETURN(*w, MoeRepackNvfp4(*w, data, scale, stream));
      }
    }
  }
  return mx ? kMoeNvfp4Repacked | kMoeMxfp4Repacked : kMoeNvfp4Repacked;
}

}  // namespace moeshard::gpu
