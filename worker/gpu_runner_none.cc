// The GPU entry points for builds without the CUDA backend.
#include "worker/model_bench.h"
#include "worker/model_runner.h"

namespace moeshard {

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateGpuModelRunner(const ModelConfig&, const TensorSource&,
                                                                   const ShardSpec&, const RunnerOptions&,
                                                                   Communicator*) {
  return absl::UnimplementedError("this moeshard was built without the CUDA backend (MOESHARD_CUDA=OFF or no nvcc)");
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateRandomGpuModelRunner(const ModelConfig&, const ShardSpec&,
                                                                         const RunnerOptions&, WeightFormat, uint64_t,
                                                                         Communicator*, WeightFormat) {
  return absl::UnimplementedError("this moeshard was built without the CUDA backend");
}

absl::StatusOr<std::string> RunModelBench(const ModelConfig&, const ModelBenchOptions&) {
  return absl::UnimplementedError("bench-model needs the CUDA backend (this build has none)");
}

}  // namespace moeshard
