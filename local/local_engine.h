// The Engine in one process: a single-worker plan over an in-process WorkerPool, and a
// caller that runs one request to its end with the router's stop-string handling
// (common/tokenizer/detokenizer.h). Used by `moeshard generate`, `moeshard check` and the
// integration suite's reference; the cluster runs the same Engine over gRPC workers.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/engine.h"
#include "worker/model_runner.h"

namespace moeshard {

struct LocalEngineOptions {
  int64_t max_model_len = 4096;        // prompt + generated tokens at most
  int64_t max_num_seqs = 16;
  int64_t max_tokens_per_step = 512;   // also the prefill chunk; at most the runner's max_batch_tokens
  bool prefix_caching = true;
};

// Starts an Engine over `pool` with the runner's KV pools (num_kv_blocks, block_size, and
// num_sliding_kv_blocks for a model with both full and sliding-window layers) and
// waits until its warm-up step went through. Errors: the handshake's or the warm-up's.
absl::StatusOr<std::unique_ptr<Engine>> StartLocalEngine(const ModelConfig& config, const RunnerOptions& kv,
                                                         std::unique_ptr<WorkerPool> pool,
                                                         const LocalEngineOptions& options = {});
// The same over `runner` (owned, or borrowed: not owned, must outlive the engine).
absl::StatusOr<std::unique_ptr<Engine>> StartLocalEngine(std::unique_ptr<ModelRunner> runner,
                                                         const LocalEngineOptions& options = {});
absl::StatusOr<std::unique_ptr<Engine>> StartLocalEngine(ModelRunner* runner, const LocalEngineOptions& options = {});

// Stop strings as the router applies them: the output ends before the first occurrence of
// any of `stop`, and the token that completed it is the last one reported.
struct TextOptions {
  const Tokenizer* tokenizer = nullptr;  // null: no text, stop strings never match
  std::vector<std::string> stop;
  bool skip_special_tokens = true;
};

struct LocalResult {
  std::vector<int32_t> tokens;  // generated; no stop / EOS token
  std::vector<TokenOutput> outputs;  // the same, with logprobs when asked for
  std::string text;             // their text, cut before a stop string
  std::string finish_reason;    // "stop" (stop token, EOS, stop string) or "length"
  std::string stop_string;      // the stop string that ended it, if one did
  double first_token_seconds = 0, seconds = 0;  // since Submit
};

// Runs `request` to its end. `on_text` (may be null) sees each token and the text it
// released. Errors: Submit's, or the request's error when a worker step failed (Unavailable).
absl::StatusOr<LocalResult> RunRequest(Engine& engine, const EngineRequest& request, const TextOptions& text = {},
                                       const std::function<void(int32_t, const std::string&)>& on_text = nullptr);

}  // namespace moeshard
