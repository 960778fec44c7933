#include "worker/gpu/expert_repack.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/moe/moe_expert.h"

namespace moeshard::gpu {
namespace {

bool EnvOff(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "0") == 0;
}

}  // namespace

std::string RepackRefusal(WeightFormat format, int64_t width, int64_t inter, ActDType act, RepackPolicy policy) {
  if (act != ActDType::kBF16) return "float32 activations (the streaming kernels take bf16)";
  if (width % 256 != 0 || inter % 256 != 0) {
    return absl::StrCat("hidden ", width, " / expert width ", inter, " not multiples of 256");
  }
  if (EnvOff("MOESHARD_MOE_REPACK")) return "MOESHARD_MOE_REPACK=0";
  const bool asked = (format == WeightFormat::kNVFP4 && policy.nvfp4) ||
                     (format == WeightFormat::kMXFP4 && policy.mxfp4) || (format == WeightFormat::kQ8_0 && policy.q8);
  if (!asked) {
    if (format != WeightFormat::kNVFP4 && format != WeightFormat::kMXFP4 && format != WeightFormat::kQ8_0) {
      return absl::StrCat(WeightFormatName(format), " experts have no streaming layout");
    }
    return absl::StrCat("--expert-layout keeps ", WeightFormatName(format), " experts as stored");
  }
  return "";
}

bool MayRepackExperts(WeightFormat format, int64_t width, int64_t inter, ActDType act, RepackPolicy policy) {
  return RepackRefusal(format, width, inter, act, policy).empty();
}

absl::StatusOr<bool> WantRepackExperts(const std::vector<MoeExpertWeights>& ex, int64_t width, int64_t inter,
                                       ActDType act, RepackPolicy policy, GpuStream stream, std::string* why) {
  auto no = [&](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
  if (ex.empty()) return no("no experts");
  if (std::string r = RepackRefusal(ex[0].gate.format, width, inter, act, policy); !r.empty()) return no(std::move(r));
  const WeightFormat f = ex[0].gate.format;
  std::vector<WeightRef> mx;  // MXFP4: every view, their scales checked in one pass
  for (size_t i = 0; i < ex.size(); ++i) {
    const MoeExpertWeights& e = ex[i];
    if (e.gate.format != f || e.up.format != f || e.down.format != f) {
      return no(absl::StrCat("expert ", i, " mixes formats (a layer streams when every matrix is ", WeightFormatName(f),
                             ")"));
    }
    if (f == WeightFormat::kNVFP4) {
      if (!MoeNvfp4Eligible(e, width, inter)) {
        return no(absl::StrCat("expert ", i, "'s NVFP4 views do not fit the streaming kernels"));
      }
      continue;
    }
    if (e.gate.rows != inter || e.gate.cols != width || e.up.rows != inter || e.up.cols != width ||
        e.down.rows != width || e.down.cols != inter) {
      return no(absl::StrCat("expert ", i, " is a column or row window, not whole matrices"));
    }
    if (f == WeightFormat::kQ8_0) {  // every scale and code is copied as it is: the shape decides
      if (!MoeQ8Repackable(e.gate) || !MoeQ8Repackable(e.up) || !MoeQ8Repackable(e.down)) {
        return no(absl::StrCat("expert ", i, "'s Q8_0 views do not fit the int8 streaming layout"));
      }
      continue;
    }
    mx.insert(mx.end(), {e.gate, e.up, e.down});
  }
  if (mx.empty()) return true;
  ASSIGN_OR_RETURN(const bool ok, MoeMxfp4Repackable(mx.data(), static_cast<int>(mx.size()), stream));
  if (!ok) {
    return no("an MXFP4 view off the streaming grid, or a block scale outside [2^-124, 2^9] (not exact in the "
              "layout's bf16 scales)");
  }
  return true;
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
