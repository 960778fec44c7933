// The backend flags shared by the commands and binaries that run a model:
//   --device cpu|cuda  --gpu N  --dtype bfloat16|float32  --kv-dtype auto|float32|bfloat16|fp8
//   --max-batch-tokens N (GPU scratch is sized for this many tokens per step)
#pragma once

#include "absl/status/statusor.h"
#include "common/flags/args.h"
#include "worker/model_runner.h"

namespace moeshard {

inline constexpr const char* kRunnerFlagNames[] = {"device", "gpu", "dtype", "kv-dtype", "max-batch-tokens"};

absl::StatusOr<RunnerOptions> ParseRunnerFlags(const Args& a, RunnerOptions base = {});

}  // namespace moeshard
