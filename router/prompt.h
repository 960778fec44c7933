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

// `tokenizer` may be null; then only token-id prompts are accepted. Errors are
// InvalidArgument naming the parameter (prompt or messages).
absl::StatusOr<std::vector<int32_t>> CompletionPromptIds(const Tokenizer* tokenizer, const CompletionRequest& request);
absl::StatusOr<std::vector<int32_t>> ChatPromptIds(const Tokenizer* tokenizer, const ChatRequest& request);

}  // namespace moeshard::router
