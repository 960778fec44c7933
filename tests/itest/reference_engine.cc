#include "tests/itest/reference_engine.h"

#include <cmath>

#include "common/status.h"
#include "local/chunked_forward.h"
#include "local/local_engine.h"

namespace moeshard::itest {

absl::StatusOr<std::unique_ptr<ReferenceEngine>> ReferenceEngine::Load(const std::string& path) {
  std::unique_ptr<ReferenceEngine> e(new ReferenceEngine());
  ASSIGN_OR_RETURN(e->model_, LoadModel(path, /*load_tokenizer=*/true));
  const ModelConfig& c = e->model_.config;
  RunnerOptions ro;
  ro.num_kv_blocks = kMaxPositions / ro.block_size + 2;
  ShardSpec shard{0, c.num_layers, 0, 1, true, true};
  ASSIGN_OR_RETURN(e->runner_, ModelRunner::Create(c, *e->model_.source, shard, ro));
  e->blocks_ = std::make_unique<BlockAllocator>(ro.num_kv_blocks);
  // LogProbs runs on the same KV pool between requests: nothing may stay cached there.
  LocalEngineOptions eo;
  eo.max_model_len = kMaxPositions + 1;
  eo.max_num_seqs = 1;
  eo.max_tokens_per_step = ro.max_batch_tokens;
  eo.prefix_caching = false;
  ASSIGN_OR_RETURN(e->engine_, StartLocalEngine(e->runner_.get(), eo));
  return e;
}

absl::StatusOr<std::vector<int32_t>> ReferenceEngine::Greedy(const std::vector<int32_t>& prompt, int64_t n) {
  GenerateOptions go;  // temperature 0, no EOS ids: greedy for exactly n tokens
  go.max_new_tokens = n;
  ASSIGN_OR_RETURN(GenerateResult r, Generate(prompt, go));
  return r.tokens;
}

absl::StatusOr<GenerateResult> ReferenceEngine::Generate(const std::vector<int32_t>& prompt, GenerateOptions options) {
  if (static_cast<int64_t>(prompt.size()) + options.max_new_tokens > kMaxPositions) {
    return absl::InvalidArgumentError("reference engine: sequence longer than it was sized for");
  }
  if (!options.stop.empty() && model_.tokenizer == nullptr) {
    return absl::FailedPreconditionError("stop strings need the model's tokenizer");
  }
  if (options.max_new_tokens == 0) return GenerateResult{{}, "length"};
  EngineRequest req;
  req.prompt_ids = prompt;
  req.max_tokens = options.max_new_tokens;
  req.sampling = options.sampling;
  req.stop_token_ids = options.eos_ids;
  req.ignore_eos = true;
  TextOptions text;
  text.tokenizer = model_.tokenizer.get();
  text.stop = options.stop;
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(LocalResult r, RunRequest(*engine_, req, text));
  return GenerateResult{std::move(r.tokens), std::move(r.finish_reason)};
}

absl::StatusOr<std::vector<std::vector<double>>> ReferenceEngine::LogProbs(const std::vector<int32_t>& seq, int64_t n) {
  const int64_t len = static_cast<int64_t>(seq.size());
  if (len > kMaxPositions || n < 1 || n > len) {
    return absl::InvalidArgumentError("reference engine: LogProbs needs 1 <= n <= the sequence's length");
  }
  std::lock_guard<std::mutex> lock(mu_);
  SeqChunk chunk{seq, 0, {}, /*all_logits=*/true};
  RETURN_IF_ERROR(blocks_->Reserve(chunk.block_table, len, runner_->block_size()));
  std::vector<float> logits;
  absl::Status st = ForwardChunked(*runner_, {chunk}, &logits);  // in steps of its max_batch_tokens
  blocks_->Free(chunk.block_table);
  RETURN_IF_ERROR(st);
  const int64_t vocab = model_.config.vocab_size;
  if (static_cast<int64_t>(logits.size()) != len * vocab) return absl::InternalError("reference engine: logits size");
  std::vector<std::vector<double>> out;
  for (int64_t p = len - n; p < len; ++p) {
    const float* row = logits.data() + p * vocab;
    double mx = row[0], sum = 0;
    for (int64_t v = 1; v < vocab; ++v) mx = std::max<double>(mx, row[v]);
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - mx);
    const double lse = mx + std::log(sum);
    std::vector<double> lp(vocab);
    for (int64_t v = 0; v < vocab; ++v) lp[v] = row[v] - lse;
    out.push_back(std::move(lp));
  }
  return out;
}

}  // namespace moeshard::itest
