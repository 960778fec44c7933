#include "local/local_engine.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/tokenizer/detokenizer.h"
#include "coordinator/plan.h"
#include "local/inprocess_worker_pool.h"

namespace moeshard {

absl::StatusOr<std::unique_ptr<Engine>> StartLocalEngine(const ModelConfig& config, const RunnerOptions& kv,
                                                         std::unique_ptr<WorkerPool> pool,
                                                         const LocalEngineOptions& options) {
  EngineOptions o;
  o.config = config;
  ASSIGN_OR_RETURN(o.plan, MakePlan(config, ParallelMode::kTensorParallel, 1, {}));
  o.num_kv_blocks = kv.num_kv_blocks;
  o.num_sliding_kv_blocks = kv.num_sliding_kv_blocks;  // the engine keeps it only for a two-kind model
  o.block_size = static_cast<int32_t>(kv.block_size);
  o.max_num_seqs = options.max_num_seqs;
  // Steps no bigger than the runner takes: a longer prompt is prefilled in chunks, and no more
  // sequences run than one step can decode (the scheduler's budget is at least max_num_seqs).
  o.max_tokens_per_step = std::min(options.max_tokens_per_step, kv.max_batch_tokens);
  o.max_num_seqs = std::min(o.max_num_seqs, o.max_tokens_per_step);
  o.max_model_len = options.max_model_len;
  o.prefix_caching = options.prefix_caching;
  o.max_handshake_refusals = 1;  // in one process a refusal cannot pass
  o.model_name = "local";
  auto engine = std::make_unique<Engine>(std::move(o), std::move(pool));
  engine->Start();
  // The warm-up step pages weights in. In one process any failure is final (a cluster retries).
  while (!engine->WaitReady(std::chrono::milliseconds(100))) {
    const std::string error = engine->GetStatus().error;
    if (!error.empty()) {
      engine->Stop();
      return absl::UnavailableError(absl::StrCat("the in-process engine did not start: ", error));
    }
  }
  return engine;
}

absl::StatusOr<std::unique_ptr<Engine>> StartLocalEngine(std::unique_ptr<ModelRunner> runner,
                                                         const LocalEngineOptions& options) {
  const ModelConfig config = runner->config();
  const RunnerOptions kv = runner->options();
  return StartLocalEngine(config, kv, std::make_unique<InProcessWorkerPool>(std::move(runner)), options);
}

absl::StatusOr<std::unique_ptr<Engine>> StartLocalEngine(ModelRunner* runner, const LocalEngineOptions& options) {
  return StartLocalEngine(runner->config(), runner->options(), std::make_unique<InProcessWorkerPool>(runner), options);
}

absl::StatusOr<LocalResult> RunRequest(Engine& engine, const EngineRequest& request, const TextOptions& text,
                                       const std::function<void(int32_t, const std::string&)>& on_text) {
  IncrementalDetokenizer::Options dopts{.stop = text.stop, .hidden_ids = request.stop_token_ids,
                                        .skip_special_tokens = text.skip_special_tokens};
  IncrementalDetokenizer detok(text.tokenizer, std::move(dopts));
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  ASSIGN_OR_RETURN(std::shared_ptr<SeqStream> stream, engine.Submit(request));
  LocalResult r;
  while (r.finish_reason.empty()) {
    std::deque<SeqUpdate> batch;
    bool done = false;
    {
      std::unique_lock<std::mutex> l(stream->mu);
      stream->cv.wait(l, [&] { return !stream->updates.empty() || stream->done; });
      batch.swap(stream->updates);
      done = stream->done;
    }
    for (const SeqUpdate& u : batch) {
      for (const TokenOutput& t : u.tokens) {
        if (r.tokens.empty()) r.first_token_seconds = since();
        r.tokens.push_back(t.token_id);
        r.outputs.push_back(t);
        const std::string piece = detok.Add(t.token_id);
        r.text += piece;
        if (on_text) on_text(t.token_id, piece);
        if (detok.stopped()) break;
      }
      if (detok.stopped()) {
        r.finish_reason = "stop";
        r.stop_string = detok.matched_stop();
        engine.Cancel(stream->seq_id);
      } else if (u.finish_reason == "abort") {
        return absl::UnavailableError(absl::StrCat("the request was aborted: ", u.error));
      } else {
        r.finish_reason = u.finish_reason;
      }
      if (!r.finish_reason.empty()) break;
    }
    if (r.finish_reason.empty() && done) return absl::CancelledError("the request was cancelled");
  }
  const std::string rest = detok.Flush();
  r.text += rest;
  if (on_text && !rest.empty()) on_text(-1, rest);
  r.seconds = since();
  return r;
}

}  // namespace moeshard
