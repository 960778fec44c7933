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
  follow_.Clear();
  next_step_ = 0;
  turn_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<StepResult> InProcessWorkerPool::Step(const StepRequest& request, std::chrono::milliseconds deadline) {
  std::unique_lock<std::mutex> l(mu_);
  if (!turn_.wait_for(l, deadline, [&] { return next_step_ >= request.step_id; }) || next_step_ != request.step_id) {
    return absl::AbortedError(absl::StrCat("step ", request.step_id, " out of order (next is ", next_step_, ")"));
  }
  absl::StatusOr<StepResult> result = RunStep(request);
  ++next_step_;
  turn_.notify_all();
  return result;
}

absl::StatusOr<StepResult> InProcessWorkerPool::RunStep(const StepRequest& request) {
  for (int64_t id : request.released_seqs) {
    samplers_.Release(id);
    follow_.Forget(id);
  }
  for (int64_t id : request.preempted_seqs) follow_.Forget(id);
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
    if (c.follow) {
      if (c.tokens.size() != 1 || !c.sample) return absl::InvalidArgumentError("a follow chunk is one sampled token");
      ASSIGN_OR_RETURN(batch.back().tokens[0], follow_.Resolve(request.step_id, c.seq_id));
    }
  }
  // Every row greedy without logprobs: the runner finds the tokens (on a GPU, only ids come back).
  bool greedy = true;
  for (const RowDraw& r : rows) greedy = greedy && r.sampling.temperature <= 0.f && !r.logprobs && r.top_logprobs == 0;
  std::vector<RowSample> drawn(rows.size());
  if (greedy) {
    std::vector<int32_t> ids;
    RETURN_IF_ERROR(runner_->ForwardArgMax(batch, &ids));
    if (ids.size() != batch.size()) return absl::InternalError("argmax rows");
    for (size_t i = 0; i < rows.size(); ++i) drawn[i].token = ids[rows[i].row];
  } else {
    std::vector<float> logits;
    RETURN_IF_ERROR(runner_->Forward(batch, &logits));
    drawn = samplers_.Sample(rows, logits.data(), runner_->config().vocab_size);
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    result.tokens.emplace_back(rows[i].seq_id, TokenOutput{drawn[i].token, drawn[i].logprob, drawn[i].top});
    follow_.Record(request.step_id, rows[i].seq_id, drawn[i].token);
  }
  return result;
}

}  // namespace moeshard
