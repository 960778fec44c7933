#include "local/inprocess_worker_pool.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace moeshard {

InProcessWorkerPool::InProcessWorkerPool(std::unique_ptr<ModelRunner> runner)
    : owned_(std::move(runner)), runner_(owned_.get()) {}

InProcessWorkerPool::InProcessWorkerPool(ModelRunner* runner) : runner_(runner) {}

absl::Status InProcessWorkerPool::Handshake(const Plan& plan, const HandshakeOptions& o) {
  if (plan.num_workers != 1) {
    return absl::InvalidArgumentError(absl::StrCat("an in-process pool is one worker; the plan has ", plan.num_workers));
  }
  const RunnerOptions& ro = runner_->options();
  const int64_t sliding = runner_->sliding_pool() ? ro.num_sliding_kv_blocks : 0;
  if (o.num_kv_blocks != ro.num_kv_blocks || o.block_size != ro.block_size || o.num_sliding_kv_blocks != sliding) {
    return absl::FailedPreconditionError(absl::StrCat("the engine's KV pool (", o.num_kv_blocks, " blocks of ", o.block_size,
                                                      ", ", o.num_sliding_kv_blocks, " sliding) is not the runner's (",
                                                      ro.num_kv_blocks, " of ", ro.block_size, ", ", sliding, " sliding)"));
  }
  std::lock_guard<std::mutex> l(mu_);
  samplers_.Clear();
  return absl::OkStatus();
}

absl::StatusOr<StepResult> InProcessWorkerPool::Step(const StepRequest& request, std::chrono::milliseconds) {
  std::lock_guard<std::mutex> l(mu_);
  for (int64_t id : request.released_seqs) samplers_.Release(id);
  StepResult result;
  if (request.chunks.empty()) return result;
  std::vector<SeqChunk> batch;
  std::vector<RowDraw> rows;
  for (const ChunkPlan& c : request.chunks) {
    if (c.sample) {
      rows.push_back({static_cast<int64_t>(batch.size()), c.seq_id, c.sampling,
                      c.start_pos + static_cast<int64_t>(c.tokens.size()), c.logprobs, c.top_logprobs});
    }
    batch.push_back(SeqChunk{c.tokens, c.start_pos, c.block_table, false, c.sliding_table});
  }
  std::vector<float> logits;
  RETURN_IF_ERROR(runner_->Forward(batch, &logits));
  const std::vector<RowSample> drawn = samplers_.Sample(rows, logits.data(), runner_->config().vocab_size);
  for (size_t i = 0; i < rows.size(); ++i) {
    result.tokens.emplace_back(rows[i].seq_id, TokenOutput{drawn[i].token, drawn[i].logprob, drawn[i].top});
  }
  return result;
}

}  // namespace moeshard
