#include "worker/runner_flags.h"

#include "common/status.h"

namespace moeshard {

absl::StatusOr<RunnerOptions> ParseRunnerFlags(const Args& a, RunnerOptions ro) {
  if (a.Has("device")) {
    ASSIGN_OR_RETURN(ro.device, ParseDevice(a.Get("device")));
  }
  ASSIGN_OR_RETURN(int64_t gpu, a.GetInt("gpu", ro.gpu_index));
  if (gpu < 0) return absl::InvalidArgumentError("--gpu must be >= 0");
  ro.gpu_index = static_cast<int>(gpu);
  if (a.Has("dtype")) {
    ASSIGN_OR_RETURN(ro.precision, ParsePrecision(a.Get("dtype")));
    if (ro.device == Device::kCpu && ro.precision != ActPrecision::kFloat32) {
      return absl::InvalidArgumentError("the CPU backend computes in float32 only (--dtype float32 or --device cuda)");
    }
  }
  if (a.Has("kv-dtype")) {
    ASSIGN_OR_RETURN(ro.kv_dtype, ParseKvDType(a.Get("kv-dtype")));
    // The CPU runner keeps its cache in float32: a narrower one asked for would be ignored.
    if (ro.device == Device::kCpu && ro.kv_dtype != KvDType::kAuto && ro.kv_dtype != KvDType::kFloat32) {
      return absl::InvalidArgumentError(
          "the CPU backend keeps its KV cache in float32 (--kv-dtype auto|float32, or --device cuda)");
    }
  }
  if (a.Has("expert-layout")) {
    ASSIGN_OR_RETURN(ro.expert_layout, ParseExpertLayout(a.Get("expert-layout")));
    if (ro.device == Device::kCpu && ro.expert_layout != ExpertLayout::kAuto) {
      return absl::InvalidArgumentError(
          "the CPU backend keeps experts as stored (--expert-layout auto, or --device cuda)");
    }
  }
  ASSIGN_OR_RETURN(ro.max_batch_tokens, a.GetInt("max-batch-tokens", ro.max_batch_tokens));
  if (ro.max_batch_tokens <= 0) return absl::InvalidArgumentError("--max-batch-tokens must be positive");
  return ro;
}

}  // namespace moeshard
