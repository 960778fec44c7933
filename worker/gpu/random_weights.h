// Random weights made on the GPU for a model config, in the shapes the loader would give a
// shard (benchmarks of models too large to write to disk and carry: a Qwen3-30B-A3B-shaped
// model, full-width Muse Spark layers, the 816B model in issue 7). Dense matrices are
// uniform with variance 1/cols in the activation dtype (or random Q8_0 kept as split Q8 when
// `dense_format` is kQ8_0); experts are in their stored format
// (bf16, Q8_0, MXFP4 or NVFP4) with random codes and block scales chosen for the same
// variance; norm weights and residual gates are ones. Returns the device weights and the
// ModelWeights counts the runner reads (no host data).
#pragma once

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/model/shard.h"
#include "worker/gpu/gpu_weights.h"

namespace moeshard::gpu {

absl::StatusOr<std::pair<std::unique_ptr<ModelWeights>, std::unique_ptr<GpuModelWeights>>> RandomModelWeights(
    const ModelConfig& c, const ShardSpec& shard, ActDType act, WeightFormat expert_format, uint64_t seed,
    GpuStream stream, WeightFormat dense_format = WeightFormat::kBF16, RepackPolicy repack = {});

}  // namespace moeshard::gpu
