// How a model's layers are divided among pipeline stages: contiguous ranges proportional to
// per-stage weights, rounded by the largest-remainder method with a floor of one layer per
// stage (stages whose share is below one layer are pinned to one layer and the rest is
// re-divided among the others). With equal weights the first num_layers % stages stages hold
// one layer more. Used by the coordinator's plan and by the in-process layer split
// (worker/inprocess_group.h). Pure functions; safe to call from any thread.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moeshard {

// Splits [0, num_layers) into weights.size() contiguous ranges [begin, end), each at least one
// layer, sizes proportional to the weights (see the top of this file).
absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> SplitLayers(
    int64_t num_layers, const std::vector<double>& weights);

// OK when every weight is finite and > 0; otherwise InvalidArgument naming the first bad one.
absl::Status CheckLayerWeights(const std::vector<double>& weights);

}  // namespace moeshard
