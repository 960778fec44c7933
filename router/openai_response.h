// OpenAI response bodies and server-sent-event chunks for /v1/completions and
// /v1/chat/completions, with logprobs in each API's format and vLLM's token-id extension
// (prompt_token_ids on the response or first chunk, token_ids on each choice).
// Objects keep their insertion order (nlohmann::ordered_json): a completion's top_logprobs
// map lists the most likely token first.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "router/generation.h"
#include "router/openai_request.h"

namespace moeshard {
class Tokenizer;
}

namespace moeshard::router {

// JSON text with any ill-formed UTF-8 replaced (never throws).
std::string DumpJson(const nlohmann::ordered_json& j);
std::string DumpJson(const nlohmann::json& j);
// "data: {json}\n\n"
std::string SseEvent(const nlohmann::ordered_json& j);
std::string SseEvent(const nlohmann::json& j);
inline constexpr char kSseDone[] = "data: [DONE]\n\n";

// A token as text: its bytes (ill-formed UTF-8 as U+FFFD), or "token_id:N" without a tokenizer.
std::string TokenText(const Tokenizer* tokenizer, int32_t token_id);

// Builds one request's response or stream chunks. Not thread-safe: one per request.
class ResponseFormatter {
 public:
  enum class Api { kCompletion, kChat };

  // `tokenizer` may be null; `params` and `prompt_ids` must outlive the formatter.
  ResponseFormatter(Api api, std::string id, std::string model, const Tokenizer* tokenizer,
                    const GenerationParams& params, const std::vector<int32_t>& prompt_ids);

  // The non-streaming response.
  nlohmann::ordered_json Full(const std::string& text, const std::vector<TokenInfo>& tokens,
                              const GenerationResult& result) const;

  // Streaming: chat starts with a chunk carrying the role; each update becomes a chunk;
  // the final chunk carries finish_reason; the usage chunk (choices: []) comes last.
  nlohmann::ordered_json RoleChunk();
  nlohmann::ordered_json DeltaChunk(const GenerationDelta& delta);
  nlohmann::ordered_json FinalChunk(const GenerationResult& result);
  nlohmann::ordered_json UsageChunk(const GenerationResult& result) const;

  static nlohmann::ordered_json Usage(const GenerationResult& result);

 private:
  nlohmann::ordered_json ChunkBase();
  nlohmann::ordered_json Logprobs(const std::vector<TokenInfo>& tokens, int64_t* text_offset) const;
  nlohmann::ordered_json CompletionLogprobs(const std::vector<TokenInfo>& tokens, int64_t* text_offset) const;
  nlohmann::ordered_json ChatLogprobs(const std::vector<TokenInfo>& tokens) const;
  static nlohmann::ordered_json StopReason(const GenerationResult& result);

  const Api api_;
  const std::string id_;
  const std::string model_;
  const Tokenizer* tokenizer_;
  const GenerationParams& params_;
  const std::vector<int32_t>& prompt_ids_;
  const int64_t created_;
  bool sent_first_ = false;
  int64_t text_offset_ = 0;
};

}  // namespace moeshard::router
