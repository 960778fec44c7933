// libFuzzer target: the Qwen3 tokenizer (testdata/qwen3moe-tok, from $MOESHARD_TESTDATA)
// and the chat template on arbitrary text. The first byte picks the path: encode, decode
// of the bytes as ids, or a chat whose messages are the NUL-separated pieces (role from
// each piece's first byte). A chat's special tokens must all come from the template.
#include <cstdlib>
#include <cstring>

#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"

namespace {

const moeshard::Tokenizer& Qwen() {
  static const moeshard::Tokenizer* tok = [] {
    const char* root = std::getenv("MOESHARD_TESTDATA");
    auto spec = moeshard::TokenizerSpecFromHfJson(std::string(root ? root : "../shared/testdata") + "/qwen3moe-tok/tokenizer.json");
    if (!spec.ok()) std::abort();  // the harness needs its data: fail loudly
    auto t = moeshard::Tokenizer::Create(*std::move(spec));
    if (!t.ok()) std::abort();
    return t->release();
  }();
  return *tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const moeshard::Tokenizer& tok = Qwen();
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0:
      (void)tok.Encode(text);
      break;
    case 1: {
      std::vector<int32_t> ids;
      for (size_t i = 0; i + 4 <= text.size(); i += 4) {
        int32_t id;
        std::memcpy(&id, text.data() + i, 4);
        ids.push_back(id % 200000);
      }
      (void)tok.Decode(ids);
      break;
    }
    default: {
      static const char* const kRoles[] = {"system", "user", "assistant", "tool"};
      std::vector<moeshard::ChatMessage> messages;
      size_t start = 0;
      while (start < text.size()) {
        size_t end = text.find('\0', start);
        if (end == std::string::npos) end = text.size();
        const std::string piece = text.substr(start, end - start);
        if (!piece.empty()) messages.push_back({kRoles[static_cast<uint8_t>(piece[0]) % 4], piece.substr(1)});
        start = end + 1;
      }
      moeshard::ChatOptions options;
      options.enable_thinking = (data[0] & 4) != 0;
      auto chat = moeshard::RenderChatMlWithRanges(messages, options);
      if (!chat.ok()) break;
      auto ids = tok.EncodeWithSpecialIn(chat->text, chat->template_ranges);
      if (!ids.ok()) break;
      // Content cannot add special tokens: at most two per message plus the prompt's one.
      const int32_t im_start = *tok.TokenId("<|im_start|>");
      size_t n = 0;
      for (int32_t id : *ids) n += id == im_start;
      if (n > messages.size() + 1) std::abort();
      break;
    }
  }
  return 0;
}
