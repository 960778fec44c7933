// Runs the forward pass of one worker's shard on the CPU backend: embedding (first
// stage), its layers, and the final norm + LM head (last stage). One description of a
// layer (attention + MoE/dense MLP, with the architecture's options from ModelConfig)
// serves every supported architecture.
//
// A batch is several sequence chunks laid end to end: chunk i feeds tokens at positions
// start_pos .. start_pos+n-1 and may read the KV cache of positions before start_pos.
// Tensor parallel: each rank computes its heads and experts; partial sums (attention
// output, expert mixture or dense MLP output) are all-reduced in fp32 through `tp_comm`.
// Not thread-safe: one batch at a time.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/comm/communicator.h"
#include "common/formats/tensor_source.h"
#include "common/model/model_config.h"
#include "common/model/shard.h"
#include "worker/kv_cache.h"
#include "worker/model_weights.h"

namespace moeshard {

struct SeqChunk {
  std::vector<int32_t> tokens;
  int64_t start_pos = 0;
  std::vector<int32_t> block_table;  // covers [0, start_pos + tokens.size())
  bool all_logits = false;           // logits for every token, else for the last only
};

struct RunnerOptions {
  int64_t num_kv_blocks = 256;
  int64_t block_size = 16;
};

class ModelRunner {
 public:
  // `src` must outlive the runner (weights are views into it). `tp_comm` may be null when
  // shard.tp_size == 1.
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(const ModelConfig& config, const TensorSource& src,
                                                             const ShardSpec& shard, const RunnerOptions& options,
                                                             Communicator* tp_comm = nullptr);

  // Checks ids, positions and block tables of a batch against the model and the cache.
  absl::Status ValidateBatch(const std::vector<SeqChunk>& batch) const;
  // hidden [T_total, H] <- embeddings of all tokens (first stage).
  absl::Status Embed(const std::vector<SeqChunk>& batch, std::vector<float>* hidden) const;
  // Runs this shard's layers over hidden in place, writing the KV cache.
  absl::Status RunLayers(const std::vector<SeqChunk>& batch, std::vector<float>* hidden);
  // logits [rows, V] for the rows each chunk asks for (last stage).
  absl::Status Head(const std::vector<SeqChunk>& batch, const std::vector<float>& hidden,
                    std::vector<float>* logits) const;
  // Embed + RunLayers + Head (a single-stage shard).
  absl::Status Forward(const std::vector<SeqChunk>& batch, std::vector<float>* logits);

  const ModelConfig& config() const { return config_; }
  const ShardSpec& shard() const { return shard_; }
  KvCache& kv_cache() { return *kv_; }
  int64_t block_size() const { return options_.block_size; }

 private:
  ModelRunner(const ModelConfig& c, const ShardSpec& s, const RunnerOptions& o, Communicator* comm)
      : config_(c), shard_(s), options_(o), comm_(comm) {}
  absl::Status AttentionBlock(int64_t li, const std::vector<SeqChunk>& batch, const std::vector<int32_t>& pos,
                              std::vector<float>& s);
  absl::Status MlpBlock(int64_t li, std::vector<float>& s);
  absl::Status AllReduce(std::vector<float>& v);

  ModelConfig config_;
  ShardSpec shard_;
  RunnerOptions options_;
  Communicator* comm_;
  std::unique_ptr<ModelWeights> w_;
  std::unique_ptr<KvCache> kv_;
};

}  // namespace moeshard
