#include "router/prompt.h"

#include "absl/strings/str_cat.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "common/status.h"
#include "router/api_error.h"

namespace moeshard::router {
namespace {

absl::Status CheckPromptBytes(int64_t num_bytes, int64_t max_prompt_bytes, const char* param) {
  if (num_bytes <= max_prompt_bytes) return absl::OkStatus();
  return InvalidParam(param, absl::StrCat("the ", param, " has ", num_bytes, " bytes of text, more than this server's limit of ",
                                          max_prompt_bytes));
}

absl::StatusOr<std::vector<int32_t>> Encode(const Tokenizer* tokenizer, const std::string& text, const char* param,
                                            const Tokenizer::Ranges* special_ok = nullptr) {
  auto ids = special_ok != nullptr ? tokenizer->EncodeWithSpecialIn(text, *special_ok) : tokenizer->Encode(text);
  if (!ids.ok()) return InvalidParam(param, absl::StrCat("cannot tokenize the ", param, ": ", ids.status().message()));
  if (ids->empty()) return InvalidParam(param, absl::StrCat("the ", param, " has no tokens"));
  return ids;
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> CompletionPromptIds(const Tokenizer* tokenizer, const CompletionRequest& request,
                                                         int64_t max_prompt_bytes) {
  if (request.prompt_is_ids) {
    if (request.prompt_ids.empty()) return InvalidParam("prompt", "'prompt' must not be empty");
    if (tokenizer != nullptr) {
      for (int32_t id : request.prompt_ids) {
        if (id < 0 || id >= tokenizer->vocab_size()) {
          return InvalidParam("prompt", absl::StrCat("token id ", id, " is outside the vocabulary (size ",
                                                     tokenizer->vocab_size(), ")"));
        }
      }
    }
    return request.prompt_ids;
  }
  if (tokenizer == nullptr) {
    return InvalidParam("prompt", "this router has no tokenizer (start it with --model): send the prompt as token ids");
  }
  RETURN_IF_ERROR(CheckPromptBytes(static_cast<int64_t>(request.prompt_text.size()), max_prompt_bytes, "prompt"));
  // Special-token text is text unless the request allows it (no range where it is special).
  static const Tokenizer::Ranges kNowhere;
  return Encode(tokenizer, request.prompt_text, "prompt", request.allow_special_tokens ? nullptr : &kNowhere);
}

absl::StatusOr<std::vector<int32_t>> ChatPromptIds(const Tokenizer* tokenizer, const ChatRequest& request,
                                                   int64_t max_prompt_bytes) {
  if (tokenizer == nullptr) {
    return InvalidParam("messages", "this router has no tokenizer and chat template (start it with --model)");
  }
  int64_t num_bytes = 0;
  for (const ChatMessage& m : request.messages) num_bytes += static_cast<int64_t>(m.content.size());
  RETURN_IF_ERROR(CheckPromptBytes(num_bytes, max_prompt_bytes, "messages"));
  auto chat = RenderChatMlWithRanges(request.messages, request.chat_options);
  if (!chat.ok()) return InvalidParam("messages", chat.status().message());
  return Encode(tokenizer, chat->text, "messages", &chat->template_ranges);
}

}  // namespace moeshard::router
