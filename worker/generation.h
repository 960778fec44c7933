// Single-process generation over one ModelRunner: prefill (optionally in chunks), then
// one-token decode steps with sampling, stopping on EOS ids, stop strings or max tokens.
// Used by `moeshard generate`, `moeshard check` and the tests; the cluster's scheduler
// does the same across workers.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "worker/kv_cache.h"
#include "worker/model_runner.h"
#include "worker/sampler.h"

namespace moeshard {

struct GenerateOptions {
  SamplingParams sampling;
  int64_t max_new_tokens = 16;
  std::vector<int32_t> eos_ids;
  std::vector<std::string> stop;        // stop strings (need a tokenizer)
  const Tokenizer* tokenizer = nullptr;
  int64_t prefill_chunk = 0;            // 0: the whole prompt in one step
};

struct GenerateResult {
  std::vector<int32_t> tokens;
  std::string finish_reason;  // "stop" (EOS or stop string) or "length"
  double prefill_seconds = 0, decode_seconds = 0;
};

// `on_token` sees each new token as it is sampled (not called for a token that completes
// a stop string). The KV blocks used are freed before returning.
absl::StatusOr<GenerateResult> Generate(ModelRunner& runner, BlockAllocator& blocks, const std::vector<int32_t>& prompt,
                                        const GenerateOptions& options,
                                        const std::function<void(int32_t)>& on_token = nullptr);

}  // namespace moeshard
