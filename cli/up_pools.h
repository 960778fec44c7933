// `moeshard up --pools FILE`: the pools of one machine's cluster, each a length class with its own
// replicas, workers, parallel mode and — where a long pool wants other settings than a short one —
// its own KV cache type and sizes. The file:
//
//   {"pools": [{"name": "32k", "max_model_len": 32768, "replicas": 1, "workers": 2,
//               "mode": "tensor-parallel", "layer_split": "2,1",
//               "kv_dtype": "fp8", "num_kv_blocks": 4096, ...}]}
//
// Every key but "name" is optional; a pool's worker or coordinator setting replaces the one `up`
// was given on its command line for that pool only. Unknown keys, wrong types, repeated names and
// out-of-range values are errors that name the pool and the key (a typo must not start a cluster
// with a silently different plan).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace moeshard {

struct UpPool {
  std::string name = "default";
  int64_t max_model_len = 0;  // 0: what the coordinator reports (the model's limit)
  int64_t replicas = 1, workers = 1;
  std::string mode = "layer-split", layer_split;
  // Flags (without "--") for this pool's workers and coordinators, in the file's order.
  std::vector<std::pair<std::string, std::string>> worker_flags, coordinator_flags;
};

// The pools of a --pools file's text.
absl::StatusOr<std::vector<UpPool>> ParseUpPools(std::string_view json);

// `flag`'s value for a process of `pool`: the pool's own (from `pool_flags`) when it has one,
// else `fallback`; `has` says whether either set it.
struct FlagValue {
  bool has = false;
  std::string value;
};
FlagValue PoolFlag(const std::vector<std::pair<std::string, std::string>>& pool_flags, std::string_view flag,
                   FlagValue fallback);

// The coordinator's --max-tokens-per-step for a pool (`step`: the pool's or the command line's,
// PoolFlag) given its workers' --max-batch-tokens (`batch`, likewise). CPU workers: `step` as it
// is. GPU workers: unset, kGpuStepTokens (at most the workers' batch: a 4,096-token prompt is one
// step, which the expert GEMMs of a prefill want; the coordinator's own default, 512, is a
// CPU's); set above the workers' batch, an error naming the pool, before any process starts (a
// GPU worker would refuse every such step).
constexpr int64_t kGpuStepTokens = 4096;
constexpr int64_t kGpuMaxBatchTokens = 8192;  // worker/model_runner.h RunnerOptions' default
absl::StatusOr<FlagValue> StepTokensFlag(std::string_view pool, bool gpu, const FlagValue& step,
                                         const FlagValue& batch);

}  // namespace moeshard
