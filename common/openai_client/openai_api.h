// Completions and chat completions against an OpenAI-compatible server, streamed or not,
// parsed into one result type and checked for OpenAI's response format on the way (object
// names, choices, finish_reason, usage arithmetic; SSE chunks that parse and end in
// [DONE]). Token ids come from vLLM's `return_token_ids` extension. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/openai_client/http_client.h"

namespace moeshard::openai_client {

struct GenRequest {
  std::vector<int32_t> prompt_ids;  // the prompt as token ids, or
  std::string prompt_text;          // as text when prompt_ids is empty
  int64_t max_tokens = 16;
  bool ignore_eos = true;
  Json extra = Json::object();  // merged into the body last (may override anything)
};

struct GenResult {
  std::vector<int32_t> token_ids, prompt_token_ids;
  std::string text, finish_reason;
  int64_t prompt_tokens = -1, completion_tokens = -1, cached_tokens = -1;  // -1: not reported
  int64_t num_chunks = 0;                                                  // streams: data events before [DONE]
  std::vector<std::string> deltas;  // streams: each chunk's text (content) as it arrived
  Json logprobs;                    // choices[0].logprobs of a non-streamed response
  Json response;                    // the whole non-streamed response
};

// What the suite's own successful requests added, so that metrics can be checked.
struct Tally {
  std::atomic<int64_t> prompt_tokens{0}, cached_tokens{0}, generation_tokens{0}, finished{0};
  std::atomic<int64_t> abandoned{0};  // requests the suite left mid-way (should count as aborts)
};

class OpenAiApi {
 public:
  OpenAiApi(const HttpClient* http, std::string model, Tally* tally)
      : http_(http), model_(std::move(model)), tally_(tally) {}
  const std::string& model() const { return model_; }
  const HttpClient& http() const { return *http_; }

  // The JSON body of a completion request: temperature 0, return_token_ids, ...
  Json CompletionBody(const GenRequest& r, bool stream) const;
  absl::StatusOr<GenResult> Complete(const GenRequest& r) const;
  // `keep_going(chunks so far)` returning false disconnects; the result then holds what
  // arrived and finish_reason is empty.
  absl::StatusOr<GenResult> CompleteStream(const GenRequest& r,
                                           const std::function<bool(int64_t)>& keep_going = nullptr) const;
  // Chat completion of `messages` at temperature 0, `extra` merged into the body.
  absl::StatusOr<GenResult> Chat(const Json& messages, int64_t max_tokens, const Json& extra, bool stream) const;

 private:
  void Count(const GenResult& g) const;

  const HttpClient* http_;
  std::string model_;
  Tally* tally_;
};

// Checks OpenAI's error body {"error": {"message", "type", "param", "code"}} of a 4xx
// response; `want_status` 0 accepts any 4xx.
absl::Status CheckErrorBody(const HttpResponse& r, int want_status = 0);

// Deterministic token-id prompts: `len` ids in [0, vocab) from `seed`.
std::vector<int32_t> MakePrompt(int64_t len, uint64_t seed, int64_t vocab);
// "[1 2 3 ... 9]" (shortened) and "the first difference at index i: a vs b".
std::string FormatIds(const std::vector<int32_t>& ids);
std::string DescribeDiff(const std::vector<int32_t>& want, const std::vector<int32_t>& got);

}  // namespace moeshard::openai_client
