#include "common/model/layer_split.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace moeshard {
namespace {

// Near-integer quotas (from floating-point division) count as the integer.
constexpr double kEps = 1e-9;

}  // namespace

absl::Status CheckLayerWeights(const std::vector<double>& weights) {
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!std::isfinite(weights[i]) || weights[i] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer weight ", i, " is ", weights[i], ": weights must be finite and > 0"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> SplitLayers(int64_t num_layers,
                                                                     const std::vector<double>& weights) {
  const int64_t n = static_cast<int64_t>(weights.size());
  if (n < 1) return absl::InvalidArgumentError("no pipeline stages to split layers over");
  if (n > num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(n, " pipeline stages for a model of ", num_layers,
                                                   " layers: every stage needs at least one layer"));
  }
  RETURN_IF_ERROR(CheckLayerWeights(weights));

  // Pin stages whose share is below one layer to exactly one, re-divide the rest; repeat.
  std::vector<int64_t> size(n, 0);
  std::vector<bool> pinned(n, false);
  int64_t left = num_layers;
  std::vector<double> quota(n, 0.0);
  for (bool changed = true; changed;) {
    changed = false;
    double wsum = 0;
    for (int64_t i = 0; i < n; ++i) wsum += pinned[i] ? 0.0 : weights[i];
    for (int64_t i = 0; i < n; ++i) quota[i] = pinned[i] ? 0.0 : left * weights[i] / wsum;
    for (int64_t i = 0; i < n; ++i) {
      if (!pinned[i] && quota[i] < 1.0 - kEps) {
        pinned[i] = true;
        size[i] = 1;
        --left;
        changed = true;
      }
    }
  }
  // Largest remainder among the others: floors, then +1 by descending fraction (ties: lower index).
  std::vector<int64_t> order;
  int64_t assigned = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (pinned[i]) continue;
    size[i] = static_cast<int64_t>(std::floor(quota[i] + kEps));
    assigned += size[i];
    order.push_back(i);
  }
  auto frac = [&](int64_t i) { return quota[i] - static_cast<double>(size[i]); };
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return frac(a) > frac(b); });
  for (size_t k = 0; assigned < left; k = (k + 1) % order.size()) {
    ++size[order[k]];
    ++assigned;
  }
  // Rounding overshoot (only from floating-point error): take back from the smallest fractions.
  for (size_t k = order.size(); assigned > left;) {
    k = (k == 0 ? order.size() : k) - 1;
    if (size[order[k]] > 1) {
      --size[order[k]];
      --assigned;
    }
  }
  std::vector<std::pair<int64_t, int64_t>> ranges(n);
  int64_t begin = 0;
  for (int64_t i = 0; i < n; ++i) {
    ranges[i] = {begin, begin + size[i]};
    begin += size[i];
  }
  return ranges;
}

}  // namespace moeshard
