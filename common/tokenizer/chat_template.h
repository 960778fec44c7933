// Chat formatting. Qwen3's ChatML template (what its tokenizer_config.json's Jinja
// template renders for plain messages), with enable_thinking.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace moeshard {

struct ChatMessage {
  std::string role;     // system | user | assistant | tool
  std::string content;
};

struct ChatOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = true;  // false appends an empty <think></think> block
};

// Errors: empty message list, unknown role, a system message not first.
absl::StatusOr<std::string> RenderChatMl(const std::vector<ChatMessage>& messages,
                                         const ChatOptions& options);

// The rendered text and the byte ranges [begin, end) the template wrote itself (sorted);
// the rest is message content, where special-token text must stay text
// (Tokenizer::EncodeWithSpecialIn).
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> template_ranges;
};
absl::StatusOr<RenderedChat> RenderChatMlWithRanges(const std::vector<ChatMessage>& messages,
                                                    const ChatOptions& options);

}  // namespace moeshard
