#include "worker/gpu/expert_repack.h"

#include <cstdlib>
#include <cstring>

#include "common/status.h"
#include "kernels/moe/moe_expert.h"

namespace moeshard::gpu {

bool MayNvfp4Repack(WeightFormat format, int64_t width, int64_t inter, ActDType act) {
  if (act != ActDType::kBF16 || format != WeightFormat::kNVFP4 || width % 256 != 0 || inter % 256 != 0) return false;
  const char* env = std::getenv("MOESHARD_MOE_REPACK");
  return env == nullptr || std::strcmp(env, "0") != 0;
}

bool WantNvfp4Repack(const std::vector<MoeExpertWeights>& ex, int64_t width, int64_t inter, ActDType act) {
  if (ex.empty() || !MayNvfp4Repack(ex[0].gate.format, width, inter, act)) return false;
  for (const MoeExpertWeights& e : ex) {
    if (e.gate.format != WeightFormat::kNVFP4 || e.up.format != WeightFormat::kNVFP4 ||
        e.down.format != WeightFormat::kNVFP4 || !MoeNvfp4Eligible(e, width, inter)) {
      return false;
    }
  }
  return true;
}

absl::Status RepackNvfp4Experts(std::vector<MoeExpertWeights>& ex, DevicePool& pool, GpuStream stream) {
  for (MoeExpertWeights& e : ex) {
    for (WeightRef* w : {&e.gate, &e.up, &e.down}) {
      ASSIGN_OR_RETURN(void* data, pool.Alloc(static_cast<size_t>(w->rows * w->cols / 2)));
      ASSIGN_OR_RETURN(void* scale, pool.Alloc(static_cast<size_t>(w->rows * w->cols / 16)));
      ASSIGN_OR_RETURN(*w, MoeRepackNvfp4(*w, data, scale, stream));
    }
  }
  return absl::OkStatus();
}

}  // namespace moeshard::gpu
