#include "tests/itest/reference_engine.h"

#include <algorithm>
#include <cmath>
#include <utility>

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

absl::StatusOr<std::vector<int32_t>> ReferenceEngine::Greedy(const std::vector<int32_t>& prompt, int64_t n,
                                                             const RouteTie* swap) {
  GenerateOptions go;  // temperature 0, no EOS ids: greedy for exactly n tokens
  go.max_new_tokens = n;
  if (swap == nullptr) {
    ASSIGN_OR_RETURN(GenerateResult r, Generate(prompt, go));
    return r.tokens;
  }
  // One request at a time (mu_): the positions the hook sees are this prompt's.
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(SetSwap(swap));
  absl::StatusOr<GenerateResult> r = GenerateLocked(prompt, go);
  RETURN_IF_ERROR(SetSwap(nullptr));
  RETURN_IF_ERROR(r.status());
  return r->tokens;
}

absl::Status ReferenceEngine::SetSwap(const RouteTie* swap) {
  if (swap == nullptr) return runner_->SetRouterLogitsHook(nullptr);
  const RouteTie t = *swap;
  const ModelConfig& c = model_.config;
  if (t.picked == t.next || t.picked < 0 || t.next < 0 || t.picked >= c.num_experts || t.next >= c.num_experts) {
    return absl::InvalidArgumentError("reference engine: a route tie names two distinct experts of the model");
  }
  if (t.position < 0 || t.layer < 0 || t.layer >= c.num_layers || !c.layers[t.layer].moe) {
    return absl::InvalidArgumentError("reference engine: a route tie's layer is not one of the model's MoE layers");
  }
  return runner_->SetRouterLogitsHook(
      [t](int64_t layer, const std::vector<int32_t>& positions, int64_t E, float* logits) {
        if (layer != t.layer) return;
        for (size_t r = 0; r < positions.size(); ++r) {
          if (positions[r] != t.position) continue;
          float* row = logits + static_cast<int64_t>(r) * E;
          std::swap(row[t.picked], row[t.next]);
          // Equal logits go to the lower index: make the exchanged pick strict.
          if (row[t.picked] == row[t.next]) row[t.picked] = std::nextafter(row[t.picked], -INFINITY);
        }
      });
}

absl::StatusOr<GenerateResult> ReferenceEngine::Generate(const std::vector<int32_t>& prompt, GenerateOptions options) {
  std::lock_guard<std::mutex> lock(mu_);
  return GenerateLocked(prompt, std::move(options));
}

absl::StatusOr<GenerateResult> ReferenceEngine::GenerateLocked(const std::vector<int32_t>& prompt,
                                                               GenerateOptions options) {
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
  ASSIGN_OR_RETURN(LocalResult r, RunRequest(*engine_, req, text));
  return GenerateResult{std::move(r.tokens), std::move(r.finish_reason)};
}

RouteTie TopKBoundary(const float* row, int64_t E, int64_t K) {
  std::vector<int32_t> idx(E);
  for (int64_t e = 0; e < E; ++e) idx[e] = static_cast<int32_t>(e);
  // The pick's order: larger logit first, equal logits the lower expert first.
  std::partial_sort(idx.begin(), idx.begin() + K + 1, idx.end(),
                    [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  RouteTie t;
  t.picked = idx[K - 1];
  t.next = idx[K];
  t.margin = static_cast<double>(row[t.picked]) - row[t.next];
  return t;
}

absl::Status ReferenceEngine::Forward(const std::vector<int32_t>& seq, std::vector<float>* logits) {
  const int64_t len = static_cast<int64_t>(seq.size());
  SeqChunk chunk{seq, 0, {}, /*all_logits=*/true};
  RETURN_IF_ERROR(blocks_->Reserve(chunk.block_table, len, runner_->block_size()));
  absl::Status st = ForwardChunked(*runner_, {chunk}, logits);  // in steps of its max_batch_tokens
  blocks_->Free(chunk.block_table);
  RETURN_IF_ERROR(st);
  if (static_cast<int64_t>(logits->size()) != len * model_.config.vocab_size)
    return absl::InternalError("reference engine: logits size");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RouteTie>> ReferenceEngine::RouteTies(const std::vector<int32_t>& seq, int64_t upto,
                                                                 int count) {
  const ModelConfig& c = model_.config;
  if (upto < 1 || upto > static_cast<int64_t>(seq.size()) || upto > kMaxPositions) {
    return absl::InvalidArgumentError("reference engine: RouteTies needs 1 <= upto <= the sequence's length");
  }
  if (count < 1) return absl::InvalidArgumentError("reference engine: RouteTies needs a count of at least 1");
  if (c.num_experts <= c.top_k) return std::vector<RouteTie>{};  // every expert runs: no tie to part on
  std::vector<RouteTie> ties;
  const int64_t K = c.top_k;
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(runner_->SetRouterLogitsHook(
      [&ties, K](int64_t layer, const std::vector<int32_t>& positions, int64_t E, float* logits) {
        for (size_t r = 0; r < positions.size(); ++r) {
          RouteTie t = TopKBoundary(logits + static_cast<int64_t>(r) * E, E, K);
          t.position = positions[r];
          t.layer = layer;
          ties.push_back(t);
        }
      }));
  const std::vector<int32_t> prefix(seq.begin(), seq.begin() + upto);
  std::vector<float> logits;
  absl::Status st = Forward(prefix, &logits);
  RETURN_IF_ERROR(runner_->SetRouterLogitsHook(nullptr));
  RETURN_IF_ERROR(st);
  const size_t keep = std::min<size_t>(count, ties.size());
  std::partial_sort(ties.begin(), ties.begin() + keep, ties.end(), [](const RouteTie& a, const RouteTie& b) {
    return a.margin < b.margin ||
           (a.margin == b.margin && (a.position < b.position || (a.position == b.position && a.layer < b.layer)));
  });
  ties.resize(keep);
  return ties;
}

absl::StatusOr<std::vector<std::vector<double>>> ReferenceEngine::LogProbs(const std::vector<int32_t>& seq, int64_t n,
                                                                           const RouteTie* swap) {
  const int64_t len = static_cast<int64_t>(seq.size());
  if (len > kMaxPositions || n < 1 || n > len) {
    return absl::InvalidArgumentError("reference engine: LogProbs needs 1 <= n <= the sequence's length");
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<float> logits;
  if (swap != nullptr) RETURN_IF_ERROR(SetSwap(swap));
  absl::Status st = Forward(seq, &logits);
  if (swap != nullptr) RETURN_IF_ERROR(SetSwap(nullptr));
  RETURN_IF_ERROR(st);
  const int64_t vocab = model_.config.vocab_size;
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
