// Qwen3's chat template (tokenizer_config.json's Jinja), rewritten for plain messages
// (no tools list, no tool calls, no reasoning_content field):
//   - a leading system message: "<|im_start|>system\n{content}<|im_end|>\n";
//   - user: "<|im_start|>user\n{content}<|im_end|>\n";
//   - assistant: reasoning is what precedes "</think>" (after any "<think>"), content what
//     follows the last "</think>". Turns after the last real user query keep their
//     reasoning as "<think>\n{reasoning}\n</think>\n\n{content}" (always for the final
//     message, otherwise only when it is non-empty); earlier turns lose it;
//   - consecutive tool messages share one user turn, each "\n<tool_response>\n{content}
//     \n</tool_response>";
//   - the generation prompt "<|im_start|>assistant\n", plus "<think>\n\n</think>\n\n"
//     when thinking is off.
// "The last real user query" is the last user message that is not a wrapped tool response.
#include "common/tokenizer/chat_template.h"

#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace moeshard {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

std::string_view LStripNewlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}

std::string_view RStripNewlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

bool IsToolResponse(std::string_view content) {
  return content.starts_with("<tool_response>") && content.ends_with("</tool_response>");
}

// The output and which of its bytes the template wrote (adjacent template parts merge).
class Writer {
 public:
  void Template(std::string_view s) {
    if (s.empty()) return;
    if (!chat_.template_ranges.empty() && chat_.template_ranges.back().second == chat_.text.size()) {
      chat_.template_ranges.back().second += s.size();
    } else {
      chat_.template_ranges.emplace_back(chat_.text.size(), chat_.text.size() + s.size());
    }
    chat_.text.append(s);
  }
  void Content(std::string_view s) { chat_.text.append(s); }
  RenderedChat Take() { return std::move(chat_); }

 private:
  RenderedChat chat_;
};

// Splits an assistant message into (reasoning, content) as the template does.
void SplitReasoning(std::string_view message, std::string_view* reasoning,
                    std::string_view* content) {
  *reasoning = {};
  *content = message;
  const size_t first_close = message.find(kThinkClose);
  if (first_close == std::string_view::npos) return;
  *content = LStripNewlines(message.substr(message.rfind(kThinkClose) + kThinkClose.size()));
  std::string_view before = RStripNewlines(message.substr(0, first_close));
  if (const size_t open = before.rfind(kThinkOpen); open != std::string_view::npos) {
    before.remove_prefix(open + kThinkOpen.size());
  }
  *reasoning = LStripNewlines(before);
}

}  // namespace

absl::StatusOr<std::string> RenderChatMl(const std::vector<ChatMessage>& messages,
                                         const ChatOptions& options) {
  auto chat = RenderChatMlWithRanges(messages, options);
  if (!chat.ok()) return chat.status();
  return std::move(chat->text);
}

absl::StatusOr<RenderedChat> RenderChatMlWithRanges(const std::vector<ChatMessage>& messages,
                                                    const ChatOptions& options) {
  if (messages.empty()) return absl::InvalidArgumentError("chat has no messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, " has unknown role '", role, "'"));
    }
    if (role == "system" && i != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("system message ", i, " is not the first message"));
    }
  }
  size_t last_query_idx = messages.size() - 1;
  for (size_t i = messages.size(); i-- > 0;) {
    if (messages[i].role == "user" && !IsToolResponse(messages[i].content)) {
      last_query_idx = i;
      break;
    }
  }

  Writer out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool is_last = i + 1 == messages.size();
    if (m.role == "system" || m.role == "user") {
      out.Template("<|im_start|>");
      out.Template(m.role);
      out.Template("\n");
      out.Content(m.content);
      out.Template("<|im_end|>\n");
    } else if (m.role == "assistant") {
      std::string_view reasoning, content;
      SplitReasoning(m.content, &reasoning, &content);
      if (i > last_query_idx && (is_last || !reasoning.empty())) {
        out.Template("<|im_start|>assistant\n<think>\n");
        out.Content(RStripNewlines(LStripNewlines(reasoning)));
        out.Template("\n</think>\n\n");
        out.Content(LStripNewlines(content));
      } else {
        out.Template("<|im_start|>assistant\n");
        out.Content(content);
      }
      out.Template("<|im_end|>\n");
    } else {  // tool
      if (i == 0 || messages[i - 1].role != "tool") out.Template("<|im_start|>user");
      out.Template("\n<tool_response>\n");
      out.Content(m.content);
      out.Template("\n</tool_response>");
      if (is_last || messages[i + 1].role != "tool") out.Template("<|im_end|>\n");
    }
  }
  if (options.add_generation_prompt) {
    out.Template("<|im_start|>assistant\n");
    if (!options.enable_thinking) out.Template("<think>\n\n</think>\n\n");
  }
  return out.Take();
}

}  // namespace moeshard
