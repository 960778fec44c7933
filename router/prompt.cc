#include "router/prompt.h"

#include "absl/strings/str_cat.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "router/api_error.h"

namespace moeshard::router {
namespace {

absl::StatusOr<std::vector<int32_t>> Encode(const Tokenizer* tokenizer, const std::string& text, const char* param) {
  auto ids = tokenizer->Encode(text);
  if (!ids.ok()) return InvalidParam(param, absl::StrCat("cannot tokenize the ", param, ": ", ids.status().message()));
  if (ids->empty()) return InvalidParam(param, absl::StrCat("the ", param, " has no tokens"));
  return ids;
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> CompletionPromptIds(const Tokenizer* tokenizer, const CompletionRequest& request) {
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
  return Encode(tokenizer, request.prompt_text, "prompt");
}

absl::StatusOr<std::vector<int32_t>> ChatPromptIds(const Tokenizer* tokenizer, const ChatRequest& request) {
  if (tokenizer == nullptr) {
    return InvalidParam("messages", "this router has no tokenizer and chat template (start it with --model)");
  }
  auto text = RenderChatMl(request.messages, request.chat_options);
  if (!text.ok()) return InvalidParam("messages", text.status().message());
  return Encode(tokenizer, *text, "messages");
}

}  // namespace moeshard::router
