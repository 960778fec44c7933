#include "router/openai_response.h"

#include <algorithm>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/detokenizer.h"

namespace moeshard::router {

using OrderedJson = nlohmann::ordered_json;

namespace {

// JSON has no -infinity; vLLM reports impossible tokens as -9999.
double FiniteLogprob(float lp) { return std::max(static_cast<double>(lp), -9999.0); }

std::string TokenBytes(const Tokenizer* tokenizer, int32_t id) {
  if (tokenizer == nullptr) return "";
  auto bytes = tokenizer->TokenBytes(id);
  return bytes.ok() ? *bytes : "";
}

OrderedJson BytesArray(const std::string& bytes) {
  OrderedJson a = OrderedJson::array();
  for (unsigned char c : bytes) a.push_back(static_cast<int>(c));
  return a;
}

OrderedJson TokenIds(const std::vector<TokenInfo>& tokens) {
  OrderedJson a = OrderedJson::array();
  for (const TokenInfo& t : tokens) a.push_back(t.id);
  return a;
}

}  // namespace

std::string DumpJson(const OrderedJson& j) { return j.dump(-1, ' ', false, OrderedJson::error_handler_t::replace); }
std::string DumpJson(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string SseEvent(const OrderedJson& j) { return absl::StrCat("data: ", DumpJson(j), "\n\n"); }
std::string SseEvent(const nlohmann::json& j) { return absl::StrCat("data: ", DumpJson(j), "\n\n"); }

std::string TokenText(const Tokenizer* tokenizer, int32_t token_id) {
  if (tokenizer == nullptr) return absl::StrCat("token_id:", token_id);
  return Utf8Lossy(TokenBytes(tokenizer, token_id));
}

ResponseFormatter::ResponseFormatter(Api api, std::string id, std::string model, const Tokenizer* tokenizer,
                                     const GenerationParams& params, const std::vector<int32_t>& prompt_ids)
    : api_(api),
      id_(std::move(id)),
      model_(std::move(model)),
      tokenizer_(tokenizer),
      params_(params),
      prompt_ids_(prompt_ids),
      created_(static_cast<int64_t>(std::time(nullptr))) {}

OrderedJson ResponseFormatter::Usage(const GenerationResult& r) {
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", r.completion_tokens},
          {"total_tokens", r.prompt_tokens + r.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}}};
}

OrderedJson ResponseFormatter::StopReason(const GenerationResult& r) {
  if (r.stop_string) return *r.stop_string;
  if (r.stop_token_id) return *r.stop_token_id;
  return nullptr;
}

OrderedJson ResponseFormatter::CompletionLogprobs(const std::vector<TokenInfo>& tokens, int64_t* text_offset) const {
  OrderedJson out = {{"tokens", OrderedJson::array()},
                     {"token_logprobs", OrderedJson::array()},
                     {"top_logprobs", OrderedJson::array()},
                     {"text_offset", OrderedJson::array()}};
  for (const TokenInfo& t : tokens) {
    const std::string text = TokenText(tokenizer_, t.id);
    out["tokens"].push_back(text);
    out["token_logprobs"].push_back(FiniteLogprob(t.logprob));
    // The N most likely tokens, most likely first, then the sampled one if it is not among
    // them (as vLLM does). Distinct tokens can read the same (partial UTF-8 shows as U+FFFD):
    // a repeated key falls back to "token_id:N" so that no alternative is lost.
    OrderedJson top = OrderedJson::object();
    bool sampled_listed = false;
    auto add = [&](int32_t id, float logprob) {
      std::string key = TokenText(tokenizer_, id);
      if (top.contains(key)) key = absl::StrCat("token_id:", id);
      top[key] = FiniteLogprob(logprob);
    };
    for (size_t i = 0; i < t.top.size() && i < static_cast<size_t>(params_.top_logprobs); ++i) {
      add(t.top[i].first, t.top[i].second);
      if (t.top[i].first == t.id) sampled_listed = true;
    }
    if (!sampled_listed) add(t.id, t.logprob);
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(*text_offset);
    *text_offset += static_cast<int64_t>(text.size());
  }
  return out;
}

OrderedJson ResponseFormatter::ChatLogprobs(const std::vector<TokenInfo>& tokens) const {
  OrderedJson content = OrderedJson::array();
  for (const TokenInfo& t : tokens) {
    OrderedJson top = OrderedJson::array();
    for (size_t i = 0; i < t.top.size() && i < static_cast<size_t>(params_.top_logprobs); ++i) {
      top.push_back({{"token", TokenText(tokenizer_, t.top[i].first)},
                     {"logprob", FiniteLogprob(t.top[i].second)},
                     {"bytes", BytesArray(TokenBytes(tokenizer_, t.top[i].first))}});
    }
    content.push_back({{"token", TokenText(tokenizer_, t.id)},
                       {"logprob", FiniteLogprob(t.logprob)},
                       {"bytes", BytesArray(TokenBytes(tokenizer_, t.id))},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

OrderedJson ResponseFormatter::Logprobs(const std::vector<TokenInfo>& tokens, int64_t* text_offset) const {
  if (!params_.logprobs) return nullptr;
  return api_ == Api::kChat ? ChatLogprobs(tokens) : CompletionLogprobs(tokens, text_offset);
}

OrderedJson ResponseFormatter::Full(const std::string& text, const std::vector<TokenInfo>& tokens,
                                    const GenerationResult& r) const {
  int64_t offset = 0;
  OrderedJson choice = {{"index", 0},
                        {"logprobs", Logprobs(tokens, &offset)},
                        {"finish_reason", r.finish_reason},
                        {"stop_reason", StopReason(r)}};
  if (api_ == Api::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  if (params_.return_token_ids) choice["token_ids"] = TokenIds(tokens);
  OrderedJson out = {{"id", id_},
                     {"object", api_ == Api::kChat ? "chat.completion" : "text_completion"},
                     {"created", created_},
                     {"model", model_},
                     {"choices", OrderedJson::array({std::move(choice)})},
                     {"usage", Usage(r)}};
  if (params_.return_token_ids) out["prompt_token_ids"] = prompt_ids_;
  return out;
}

OrderedJson ResponseFormatter::ChunkBase() {
  OrderedJson out = {{"id", id_},
                     {"object", api_ == Api::kChat ? "chat.completion.chunk" : "text_completion"},
                     {"created", created_},
                     {"model", model_}};
  if (!sent_first_ && params_.return_token_ids) out["prompt_token_ids"] = prompt_ids_;
  sent_first_ = true;
  return out;
}

OrderedJson ResponseFormatter::RoleChunk() {
  OrderedJson out = ChunkBase();
  out["choices"] = OrderedJson::array({{{"index", 0},
                                        {"delta", {{"role", "assistant"}, {"content", ""}}},
                                        {"logprobs", nullptr},
                                        {"finish_reason", nullptr}}});
  return out;
}

OrderedJson ResponseFormatter::DeltaChunk(const GenerationDelta& delta) {
  OrderedJson out = ChunkBase();
  OrderedJson choice = {{"index", 0}, {"logprobs", Logprobs(delta.tokens, &text_offset_)}, {"finish_reason", nullptr}};
  if (api_ == Api::kChat) {
    choice["delta"] = {{"content", delta.text}};
  } else {
    choice["text"] = delta.text;
  }
  if (params_.return_token_ids) choice["token_ids"] = TokenIds(delta.tokens);
  out["choices"] = OrderedJson::array({std::move(choice)});
  return out;
}

OrderedJson ResponseFormatter::FinalChunk(const GenerationResult& r) {
  OrderedJson out = ChunkBase();
  OrderedJson choice = {
      {"index", 0}, {"logprobs", nullptr}, {"finish_reason", r.finish_reason}, {"stop_reason", StopReason(r)}};
  if (api_ == Api::kChat) {
    choice["delta"] = OrderedJson::object();
  } else {
    choice["text"] = "";
  }
  if (params_.return_token_ids) choice["token_ids"] = OrderedJson::array();
  out["choices"] = OrderedJson::array({std::move(choice)});
  return out;
}

OrderedJson ResponseFormatter::UsageChunk(const GenerationResult& r) const {
  return {{"id", id_},
          {"object", api_ == Api::kChat ? "chat.completion.chunk" : "text_completion"},
          {"created", created_},
          {"model", model_},
          {"choices", OrderedJson::array()},
          {"usage", Usage(r)}};
}

}  // namespace moeshard::router
