// `moeshard bench-model`: prefill and decode throughput of a model with random weights made
// on a GPU (worker/gpu/random_weights.h), each figure against its floor measured in the same
// run: the device's copy bandwidth (a large device-to-device copy, bytes read + written)
// and its bf16 matrix rate (a large cuBLAS GEMM).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "kernels/cpu/weight_ref.h"
#include "worker/model_runner.h"

namespace moeshard {

struct ModelBenchOptions {
  RunnerOptions runner;           // device, precision, KV dtype (block counts are set here)
  WeightFormat expert_format = WeightFormat::kNVFP4;
  WeightFormat dense_format = WeightFormat::kBF16;  // kQ8_0: dense matrices as a Q8_0 file's (split Q8)
  int64_t prompt_len = 4096;
  int64_t decode_steps = 32;
  std::vector<int64_t> streams = {1, 4};
  uint64_t seed = 1;
};

// Runs the benchmark and returns its report (a Markdown table and the floors).
// Unimplemented in builds without the CUDA backend.
absl::StatusOr<std::string> RunModelBench(const ModelConfig& config, const ModelBenchOptions& options);

// A runner of `config` with random weights made on the GPU (no checkpoint).
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateRandomGpuModelRunner(const ModelConfig& config,
                                                                         const ShardSpec& shard,
                                                                         const RunnerOptions& options,
                                                                         WeightFormat expert_format, uint64_t seed,
                                                                         Communicator* tp_comm = nullptr,
                                                                         WeightFormat dense_format = WeightFormat::kBF16);

}  // namespace moeshard
