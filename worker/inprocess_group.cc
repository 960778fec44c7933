#include "worker/inprocess_group.h"

#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/comm/local_communicator.h"
#include "common/model/layer_split.h"
#include "common/status.h"

namespace moeshard {
namespace {

ShardSpec WholeModel(const ModelConfig& c) { return {0, c.num_layers, 0, 1, true, true}; }

// Runs fn(rank) on one thread per rank; the first failure aborts the group so that peers
// blocked in a collective return, and is reported with its rank.
absl::Status OnEveryRank(int n, const std::vector<std::unique_ptr<Communicator>>& comms,
                         const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> st(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      st[r] = fn(r);
      if (!st[r].ok()) comms[r]->Abort();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!st[r].ok() && st[r].code() != absl::StatusCode::kAborted) {
      return absl::Status(st[r].code(), absl::StrCat("tp rank ", r, ": ", st[r].message()));
    }
  }
  for (int r = 0; r < n; ++r) RETURN_IF_ERROR(st[r]);
  return absl::OkStatus();
}

class TensorParallelGroup : public ModelRunner {
 public:
  TensorParallelGroup(const ModelConfig& c, const RunnerOptions& o, int tp)
      : ModelRunner(c, WholeModel(c), o), group_(LocalGroup::Create(tp)), runners_(tp) {
    for (int r = 0; r < tp; ++r) comms_.push_back(group_->Rank(r));
  }
  absl::Status Init(const TensorSource& src) {
    const int tp = static_cast<int>(runners_.size());
    return OnEveryRank(tp, comms_, [&](int r) -> absl::Status {
      ShardSpec s{0, config_.num_layers, r, tp, true, true};
      ASSIGN_OR_RETURN(runners_[r], ModelRunner::Create(config_, src, s, options_, comms_[r].get()));
      return absl::OkStatus();
    });
  }
  absl::Status Embed(const std::vector<SeqChunk>& batch, std::vector<float>* hidden) override {
    return runners_[0]->Embed(batch, hidden);  // every rank holds the whole embedding
  }
  absl::Status RunLayers(const std::vector<SeqChunk>& batch, std::vector<float>* hidden) override {
    std::vector<std::vector<float>> h(runners_.size(), *hidden);
    RETURN_IF_ERROR(Each([&](int r) { return runners_[r]->RunLayers(batch, &h[r]); }));
    *hidden = std::move(h[0]);
    return absl::OkStatus();
  }
  absl::Status Head(const std::vector<SeqChunk>& batch, const std::vector<float>& hidden,
                    std::vector<float>* logits) override {
    return runners_[0]->Head(batch, hidden, logits);
  }
  absl::Status Forward(const std::vector<SeqChunk>& batch, std::vector<float>* logits) override {
    std::vector<std::vector<float>> out(runners_.size());
    RETURN_IF_ERROR(Each([&](int r) { return runners_[r]->Forward(batch, &out[r]); }));
    *logits = std::move(out[0]);
    return absl::OkStatus();
  }
  size_t kv_bytes() const override {
    size_t b = 0;
    for (auto& r : runners_) b += r->kv_bytes();
    return b;
  }
  std::string backend() const override {
    return absl::StrCat(runners_[0]->backend(), ", tensor parallel ", runners_.size());
  }

 private:
  absl::Status Each(const std::function<absl::Status(int)>& fn) {
    return OnEveryRank(static_cast<int>(runners_.size()), comms_, fn);
  }
  std::shared_ptr<LocalGroup> group_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<ModelRunner>> runners_;
};

class LayerSplitChain : public ModelRunner {
 public:
  LayerSplitChain(const ModelConfig& c, const RunnerOptions& o) : ModelRunner(c, WholeModel(c), o) {}
  absl::Status Init(const TensorSource& src, int stages) {
    ASSIGN_OR_RETURN(auto ranges, SplitLayers(config_.num_layers, std::vector<double>(stages, 1.0)));
    for (int s = 0; s < stages; ++s) {
      ShardSpec sh{ranges[s].first, ranges[s].second, 0, 1, s == 0, s == stages - 1};
      ASSIGN_OR_RETURN(auto r, ModelRunner::Create(config_, src, sh, options_));
      stages_.push_back(std::move(r));
    }
    return absl::OkStatus();
  }
  absl::Status Embed(const std::vector<SeqChunk>& batch, std::vector<float>* hidden) override {
    return stages_.front()->Embed(batch, hidden);
  }
  absl::Status RunLayers(const std::vector<SeqChunk>& batch, std::vector<float>* hidden) override {
    for (auto& s : stages_) {
      RETURN_IF_ERROR(s->RunLayers(batch, hidden));
    }
    return absl::OkStatus();
  }
  absl::Status Head(const std::vector<SeqChunk>& batch, const std::vector<float>& hidden,
                    std::vector<float>* logits) override {
    return stages_.back()->Head(batch, hidden, logits);
  }
  size_t kv_bytes() const override {
    size_t b = 0;
    for (auto& s : stages_) b += s->kv_bytes();
    return b;
  }
  std::string backend() const override {
    return absl::StrCat(stages_[0]->backend(), ", layer split ", stages_.size());
  }

 private:
  std::vector<std::unique_ptr<ModelRunner>> stages_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateInProcessRunner(const ModelConfig& config, const TensorSource& src,
                                                                   const RunnerOptions& options, int tp, int stages) {
  if (tp < 1 || stages < 1) return absl::InvalidArgumentError("tensor parallel size and stage count must be >= 1");
  if (tp > 1 && stages > 1) {
    return absl::InvalidArgumentError("in-process runs combine tensor parallel and layer split only in a cluster");
  }
  if (tp > 1) {
    auto g = std::make_unique<TensorParallelGroup>(config, options, tp);
    RETURN_IF_ERROR(g->Init(src));
    return std::unique_ptr<ModelRunner>(std::move(g));
  }
  if (stages > 1) {
    if (stages > config.num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer split into ", stages, " stages exceeds the model's ", config.num_layers, " layers"));
    }
    auto c = std::make_unique<LayerSplitChain>(config, options);
    RETURN_IF_ERROR(c->Init(src, stages));
    return std::unique_ptr<ModelRunner>(std::move(c));
  }
  return ModelRunner::Create(config, src, WholeModel(config), options);
}

}  // namespace moeshard
