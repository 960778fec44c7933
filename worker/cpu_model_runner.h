// The CPU backend of ModelRunner: float32 throughout, weights read in their stored format
// from the memory-mapped checkpoint (kernels/cpu). The reference every other backend is
// checked against. RunLayers runs the model file's layer sequence (worker/model) over this
// runner's LayerOps: each op is plain kernels/cpu calls on the step's buffers, no fusion, and
// the hints the ops take are ignored.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "worker/kv_cache.h"
#include "worker/model/layer_ops.h"
#include "worker/model_runner.h"
#include "worker/model_weights.h"

namespace moeshard {

class CpuModelRunner : public ModelRunner, private LayerOps {
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
  absl::Status SetRouterLogitsHook(RouterLogitsHook hook) override {
    router_hook_ = std::move(hook);
    return absl::OkStatus();
  }

 private:
  CpuModelRunner(const ModelConfig& c, const ShardSpec& s, const RunnerOptions& o, Communicator* comm)
      : ModelRunner(c, s, o), comm_(comm) {}

  // LayerOps (layer_ops.h), on the step's buffers below.
  absl::Status AttentionInput(int64_t li, const AttentionInputOpts& opts) override;
  absl::Status Attention(int64_t li, int64_t window) override;
  absl::Status OutputGate(int64_t li) override;
  absl::Status OutputProjection(int64_t li) override;
  absl::Status Residual(int64_t li, Block block, const ResidualOpts& opts) override;
  absl::Status MlpInput(int64_t li, const MlpInputOpts& opts) override;
  absl::Status DenseMlp(int64_t li) override;
  absl::Status Route(int64_t li, const RouteOpts& opts) override;
  absl::Status LatentIn(int64_t li) override;
  absl::Status Experts(int64_t li, const ExpertsOpts& opts) override;
  absl::Status LatentOut(int64_t li) override;

  absl::Status AllReduce(std::vector<float>& v);
  int64_t T() const { return static_cast<int64_t>(pos_.size()); }

  Communicator* comm_;
  std::unique_ptr<ModelWeights> w_;
  std::unique_ptr<KvCache> kv_;
  // The current step (RunLayers): its chunks, positions and residual stream s [T, H].
  const std::vector<SeqChunk>* batch_ = nullptr;
  int64_t trace_row_ = -1;  // TraceRow of the current step
  std::vector<int32_t> pos_;
  std::vector<float>* s_ = nullptr;
  // Attention block: normalized input x [T, H], q/k/v, attention output o, block output a [T, H].
  std::vector<float> x_, q_, k_, v_, o_, a_;
  // MLP block: normalized input y [T, H], block output f [T, H], routing (ids, weights),
  // the experts' input z and their mix [T, width] at latent width when the route says latent.
  std::vector<float> y_, f_, wts_, z_, mix_;
  std::vector<int32_t> ids_;
  bool latent_ = false;
  RouterLogitsHook router_hook_;
};

}  // namespace moeshard
