// Requests to prompt token ids: text through the tokenizer, chat messages through the
// Qwen3 ChatML template first, token ids checked against the vocabulary.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "router/openai_request.h"

namespace moeshard {
class Tokenizer;
}

namespace moeshard::router {

// The default of --max-prompt-bytes: prompt text (or all messages' content) longer than
// this is refused before it is tokenized.
inline constexpr int64_t kDefaultMaxPromptBytes = 4 << 20;

// `tokenizer` may be null; then only token-id prompts are accepted. Errors are
// InvalidArgument naming the parameter (prompt or messages). Special-token text inside
// chat message content is tokenized as text: only the template writes real special tokens.
// So is special-token text in a completion prompt, unless the request sets
// allow_special_tokens.
absl::StatusOr<std::vector<int32_t>> CompletionPromptIds(const Tokenizer* tokenizer, const CompletionRequest& request,
                                                         int64_t max_prompt_bytes = kDefaultMaxPromptBytes);
absl::StatusOr<std::vector<int32_t>> ChatPromptIds(const Tokenizer* tokenizer, const ChatRequest& request,
                                                   int64_t max_prompt_bytes = kDefaultMaxPromptBytes);

}  // namespace moeshard::router
