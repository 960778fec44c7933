// OpenAI request bodies (POST /v1/completions, /v1/chat/completions) parsed and validated
// into typed requests. Pure functions: every error is an InvalidArgument status that
// names the parameter (see api_error.h), so the HTTP layer only renders it.
//
// Accepted besides OpenAI's parameters: vLLM's top_k, min_p, stop_token_ids, ignore_eos,
// skip_special_tokens, return_token_ids, chat_template_kwargs.enable_thinking, and
// allow_special_tokens (completions: special-token text in the prompt is special). Fields this
// router does not implement are refused when they would change the output (n != 1,
// echo, best_of > 1, penalties != 0, tools, non-text response_format) and ignored
// otherwise (user, metadata, ...).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/sampling/sampling_params.h"
#include "common/tokenizer/chat_template.h"

namespace moeshard::router {

inline constexpr int kMaxStopStrings = 4;
inline constexpr int kMaxTopLogprobs = 20;

// What every generation request carries, whichever API it came through.
struct GenerationParams {
  std::string model;                  // "" = the served model
  std::optional<int64_t> max_tokens;  // none = fill the context
  SamplingParams sampling{.temperature = 1.f};  // OpenAI's default temperature; top_k 0 = off
  std::vector<std::string> stop;  // up to kMaxStopStrings, none empty
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool logprobs = false;     // return the sampled tokens' logprobs
  int32_t top_logprobs = 0;  // and this many alternatives per token
  bool stream = false;
  bool include_usage = false;       // stream_options.include_usage
  bool return_token_ids = false;    // vLLM: prompt_token_ids and token_ids
  bool skip_special_tokens = true;  // special tokens add no text
};

struct CompletionRequest {
  GenerationParams params;
  bool prompt_is_ids = false;
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  // "allow_special_tokens": special-token text in a text prompt ("<|im_start|>", EOS, ...)
  // becomes the special tokens. Off by default: it is tokenized as text, like chat content.
  bool allow_special_tokens = false;
};

struct ChatRequest {
  GenerationParams params;
  std::vector<ChatMessage> messages;
  ChatOptions chat_options;  // add_generation_prompt, enable_thinking
};

absl::StatusOr<CompletionRequest> ParseCompletionRequest(std::string_view body);
absl::StatusOr<ChatRequest> ParseChatRequest(std::string_view body);

// Range checks shared with the gRPC API (which fills GenerationParams from protobuf).
absl::Status ValidateGenerationParams(const GenerationParams& params);

// NotFound (404, code model_not_found) unless `requested` is empty or the served name.
absl::Status CheckModelName(const std::string& requested, const std::string& served);

}  // namespace moeshard::router
