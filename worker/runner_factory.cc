// ModelRunner::Create: the backend of RunnerOptions::device.
#include "worker/cpu_model_runner.h"
#include "worker/model_runner.h"

namespace moeshard {

absl::StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(const ModelConfig& config, const TensorSource& src,
                                                                 const ShardSpec& shard, const RunnerOptions& options,
                                                                 Communicator* tp_comm) {
  if (shard.tp_size > 1 && (tp_comm == nullptr || tp_comm->size() != shard.tp_size)) {
    return absl::InvalidArgumentError("tensor parallel shard needs a communicator of tp_size ranks");
  }
  if (options.block_size <= 0 || options.num_kv_blocks <= 0) {
    return absl::InvalidArgumentError("KV cache needs a positive block size and block count");
  }
  if (options.device == Device::kCuda) return CreateGpuModelRunner(config, src, shard, options, tp_comm);
  return CpuModelRunner::Create(config, src, shard, options, tp_comm);
}

}  // namespace moeshard
