// libFuzzer target: the OpenAI request parser (completions and chat) on arbitrary bodies.
#include <string_view>

#include "router/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  (void)moeshard::router::ParseCompletionRequest(body);
  (void)moeshard::router::ParseChatRequest(body);
  return 0;
}
