// The parallel plan: which layers and which tensor-parallel slice each worker owns.
//
// Workers form a pp_size x tp_size grid. The rank formula, used everywhere a worker index
// is derived from grid coordinates:
//
//   worker = pp_rank * tp_size + tp_rank      (pp_rank in [0, pp_size), tp_rank in [0, tp_size))
//
// so the tp_size workers of one pipeline stage are adjacent. Today only the two pure modes are
// offered (layer split: pp = n, tp = 1; tensor parallel: pp = 1, tp = n), but the builder works
// on the grid so pp x tp can be exposed later without changing the shard arithmetic.
//
// Layer ranges come from SplitLayers (common/model/layer_split.h): contiguous, proportional to
// per-stage weights. Pure functions; no state; safe to call from any thread.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/layer_split.h"
#include "common/model/model_config.h"
#include "common/model/shard.h"

namespace moeshard {

enum class ParallelMode { kLayerSplit, kTensorParallel };

// "layer-split" or "tensor-parallel"; anything else is InvalidArgument.
absl::StatusOr<ParallelMode> ParseMode(const std::string& name);
std::string ModeName(ParallelMode mode);

struct Plan {
  ParallelMode mode = ParallelMode::kLayerSplit;
  int num_workers = 0;
  int pp_size = 1;
  int tp_size = 1;
  std::vector<ShardSpec> shards;  // shards[w] for worker w = pp_rank * tp_size + tp_rank

  int WorkerIndex(int pp_rank, int tp_rank) const { return pp_rank * tp_size + tp_rank; }
  int PpRank(int worker) const { return worker / tp_size; }
  int TpRank(int worker) const { return worker % tp_size; }
  // One line per worker, for logs and the CLI.
  std::string Describe() const;
};

// Builds the plan for `num_workers` workers. `layer_weights` gives one positive weight per
// pipeline stage (empty = even split); with tensor parallelism there is one stage, so it must
// be empty or hold one value. Errors (InvalidArgument) name the problem: num_workers < 1, more
// stages than layers, a weight count that does not match the stages, non-positive weights, or
// a tensor-parallel size that does not divide the model (the error lists the worker counts
// that do).
absl::StatusOr<Plan> MakePlan(const ModelConfig& config, ParallelMode mode, int num_workers,
                              const std::vector<double>& layer_weights);

// Parses "2,1,1" (spaces allowed) into {2, 1, 1}; "" gives an empty vector (even split).
// Every value must be a finite number > 0.
absl::StatusOr<std::vector<double>> ParseLayerWeights(const std::string& text);

// The tensor-parallel sizes in [1, num_kv_heads] that divide this model (KV heads, experts and,
// when the model has dense layers, the dense intermediate size).
std::vector<int> ValidTensorParallelSizes(const ModelConfig& config);

}  // namespace moeshard
