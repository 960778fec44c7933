// The CPU backend of ModelRunner: float32 throughout, weights read in their stored format
// from the memory-mapped checkpoint (kernels/cpu). The reference every other backend is
// checked against.
#pragma once

#include <memory>

#include "worker/kv_cache.h"
#include "worker/model_runner.h"
#include "worker/model_weights.h"

namespace moeshard {

class CpuModelRunner : public ModelRunner {
 public:
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(const ModelConfig& config, const TensorSource& src,
                                                             const ShardSpec& shard, const RunnerOptions& options,
                                                             Communicator* tp_comm);

  absl::Status Embed(const std::vector<SeqChunk>& batch, std::vector<float>* hidden) override;
  absl::Status RunLayers(const std::vector<SeqChunk>& batch, std::vector<float>* hidden) override;
  absl::Status Head(const std::vector<SeqChunk>& batch, const std::vector<float>& hidden,
                    std::vector<float>* logits) override;
  size_t kv_bytes() const override { return kv_->bytes(); }
  std::string backend() const override { return "cpu float32"; }

 private:
  CpuModelRunner(const ModelConfig& c, const ShardSpec& s, const RunnerOptions& o, Communicator* comm)
      : ModelRunner(c, s, o), comm_(comm) {}
  absl::Status AttentionBlock(int64_t li, const std::vector<SeqChunk>& batch, const std::vector<int32_t>& pos,
                              std::vector<float>& s);
  absl::Status MlpBlock(int64_t li, std::vector<float>& s);
  absl::Status AllReduce(std::vector<float>& v);

  Communicator* comm_;
  std::unique_ptr<ModelWeights> w_;
  std::unique_ptr<KvCache> kv_;
};

}  // namespace moeshard
