#include "coordinator/plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status.h"
#include "worker/model_weights.h"

namespace moeshard {
namespace {

// Near-integer quotas (from floating-point division) count as the integer.
constexpr double kEps = 1e-9;

absl::Status CheckWeights(const std::vector<double>& weights) {
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!std::isfinite(weights[i]) || weights[i] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer weight ", i, " is ", weights[i], ": weights must be finite and > 0"));
    }
  }
  return absl::OkStatus();
}

std::string TpError(const ModelConfig& c, int tp_size, const absl::Status& why) {
  std::vector<int> valid = ValidTensorParallelSizes(c);
  std::string what = absl::StrCat(c.num_kv_heads, " KV heads");
  if (c.num_experts > 0) absl::StrAppend(&what, ", ", c.num_experts, " experts");
  bool has_dense = std::any_of(c.layers.begin(), c.layers.end(), [](const LayerSpec& l) { return !l.moe; });
  if (has_dense && c.dense_intermediate > 0) {
    absl::StrAppend(&what, ", dense intermediate ", c.dense_intermediate);
  }
  return absl::StrCat("tensor parallel over ", tp_size, " workers does not fit this model (", why.message(),
                      "); worker counts that work: ", absl::StrJoin(valid, ", "), " (they divide ", what, ")");
}

}  // namespace

absl::StatusOr<ParallelMode> ParseMode(const std::string& name) {
  if (name == "layer-split") return ParallelMode::kLayerSplit;
  if (name == "tensor-parallel") return ParallelMode::kTensorParallel;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown parallel mode '", name, "' (expected layer-split or tensor-parallel)"));
}

std::string ModeName(ParallelMode mode) {
  return mode == ParallelMode::kLayerSplit ? "layer-split" : "tensor-parallel";
}

std::string Plan::Describe() const {
  std::string out = absl::StrCat(ModeName(mode), ", ", num_workers, " workers (pp ", pp_size, " x tp ", tp_size, ")");
  for (size_t w = 0; w < shards.size(); ++w) {
    absl::StrAppend(&out, "\n  worker ", w, " (stage ", PpRank(static_cast<int>(w)), "): ", shards[w].DebugString());
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> SplitLayers(int64_t num_layers,
                                                                     const std::vector<double>& weights) {
  const int64_t n = static_cast<int64_t>(weights.size());
  if (n < 1) return absl::InvalidArgumentError("no pipeline stages to split layers over");
  if (n > num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(n, " pipeline stages for a model of ", num_layers,
                                                   " layers: every stage needs at least one layer"));
  }
  RETURN_IF_ERROR(CheckWeights(weights));

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

std::vector<int> ValidTensorParallelSizes(const ModelConfig& c) {
  std::vector<int> valid;
  const int64_t limit = std::max<int64_t>(1, c.num_kv_heads);
  for (int64_t t = 1; t <= limit; ++t) {
    ShardSpec s;
    s.layer_begin = 0;
    s.layer_end = c.num_layers;
    s.tp_size = static_cast<int>(t);
    if (ValidateShard(c, s).ok()) valid.push_back(static_cast<int>(t));
  }
  return valid;
}

absl::StatusOr<Plan> MakePlan(const ModelConfig& config, ParallelMode mode, int num_workers,
                              const std::vector<double>& layer_weights) {
  if (num_workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("need at least one worker, got ", num_workers));
  }
  if (config.num_layers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("model has ", config.num_layers, " layers"));
  }
  Plan plan;
  plan.mode = mode;
  plan.num_workers = num_workers;
  plan.pp_size = mode == ParallelMode::kLayerSplit ? num_workers : 1;
  plan.tp_size = mode == ParallelMode::kTensorParallel ? num_workers : 1;

  std::vector<double> weights = layer_weights;
  if (weights.empty()) weights.assign(plan.pp_size, 1.0);
  if (static_cast<int>(weights.size()) != plan.pp_size) {
    return absl::InvalidArgumentError(absl::StrCat(weights.size(), " layer weights given for ", plan.pp_size,
                                                   " pipeline stage(s) of ", ModeName(mode), " over ",
                                                   num_workers, " workers"));
  }
  ASSIGN_OR_RETURN(auto ranges, SplitLayers(config.num_layers, weights));

  plan.shards.resize(num_workers);
  for (int pp = 0; pp < plan.pp_size; ++pp) {
    for (int tp = 0; tp < plan.tp_size; ++tp) {
      ShardSpec& s = plan.shards[plan.WorkerIndex(pp, tp)];
      s.layer_begin = ranges[pp].first;
      s.layer_end = ranges[pp].second;
      s.tp_rank = tp;
      s.tp_size = plan.tp_size;
      s.first_stage = pp == 0;
      s.last_stage = pp == plan.pp_size - 1;
      absl::Status st = ValidateShard(config, s);
      if (!st.ok()) {
        if (plan.tp_size > 1) return absl::InvalidArgumentError(TpError(config, plan.tp_size, st));
        return st;
      }
    }
  }
  return plan;
}

absl::StatusOr<std::vector<double>> ParseLayerWeights(const std::string& text) {
  std::vector<double> weights;
  if (absl::StripAsciiWhitespace(text).empty()) return weights;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    absl::string_view item = absl::StripAsciiWhitespace(part);
    double v = 0;
    if (item.empty() || !absl::SimpleAtod(item, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("layer weights '", text, "': '", item, "' is not a number"));
    }
    weights.push_back(v);
  }
  absl::Status st = CheckWeights(weights);
  if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("layer weights '", text, "': ", st.message()));
  return weights;
}

}  // namespace moeshard
