#include "common/sampling/sampling_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace moeshard {

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0.f) || temperature > 100.f || std::isnan(temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be in [0, 100], got ", temperature));
  }
  if (top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", top_k));
  if (!(top_p > 0.f && top_p <= 1.f)) return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  if (!(min_p >= 0.f && min_p <= 1.f)) return absl::InvalidArgumentError(absl::StrCat("min_p must be in [0, 1], got ", min_p));
  return absl::OkStatus();
}

}  // namespace moeshard
