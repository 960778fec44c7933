#include "coordinator/plan.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status.h"

namespace moeshard {
namespace {

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
  absl::Status st = CheckLayerWeights(weights);
  if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("layer weights '", text, "': ", st.message()));
  return weights;
}

}  // namespace moeshard
