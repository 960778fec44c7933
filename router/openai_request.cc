#include "router/openai_request.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "router/api_error.h"

namespace moeshard::router {
namespace {

using Json = nlohmann::json;

// The field `name` of `obj`, or null when absent or JSON null (OpenAI treats both as unset).
const Json* Field(const Json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status WrongType(const char* name, const char* expected) {
  return InvalidParam(name, absl::StrCat("'", name, "' must be ", expected));
}

// An integer (a float with an integral value is accepted, as pydantic does).
absl::StatusOr<int64_t> AsInt(const Json& v, const char* name, int64_t lo, int64_t hi) {
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) {
      return InvalidParam(name, absl::StrCat("'", name, "' must be between ", lo, " and ", hi, ", got ", u));
    }
    x = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::floor(d) != d || std::fabs(d) > 9.0e18) return WrongType(name, "an integer");
    x = static_cast<int64_t>(d);
  } else {
    return WrongType(name, "an integer");
  }
  if (x < lo || x > hi) {
    return InvalidParam(name, absl::StrCat("'", name, "' must be between ", lo, " and ", hi, ", got ", x));
  }
  return x;
}

absl::Status ReadInt(const Json& obj, const char* name, int64_t lo, int64_t hi, std::optional<int64_t>* out) {
  if (const Json* v = Field(obj, name)) {
    ASSIGN_OR_RETURN(*out, AsInt(*v, name, lo, hi));
  }
  return absl::OkStatus();
}

absl::Status ReadDouble(const Json& obj, const char* name, double* out) {
  if (const Json* v = Field(obj, name)) {
    if (!v->is_number()) return WrongType(name, "a number");
    *out = v->get<double>();
  }
  return absl::OkStatus();
}

absl::Status ReadBool(const Json& obj, const char* name, bool* out) {
  if (const Json* v = Field(obj, name)) {
    if (!v->is_boolean()) return WrongType(name, "a boolean");
    *out = v->get<bool>();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> AsTokenIds(const Json& v, const char* name) {
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const Json& t : v) {
    if (!t.is_number_integer()) return WrongType(name, "a list of token ids (integers)");
    ASSIGN_OR_RETURN(int64_t id, AsInt(t, name, 0, std::numeric_limits<int32_t>::max()));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

bool AllIntegers(const Json& array) {
  for (const Json& t : array) {
    if (!t.is_number_integer()) return false;
  }
  return true;
}

// Parameters that would change the output if set, but that this router does not implement.
absl::Status RefuseUnsupported(const Json& j) {
  auto refuse = [](const char* name, const std::string& why) { return InvalidParam(name, why); };
  if (const Json* v = Field(j, "n")) {
    ASSIGN_OR_RETURN(int64_t n, AsInt(*v, "n", 1, std::numeric_limits<int32_t>::max()));
    if (n != 1) return refuse("n", absl::StrCat("only n=1 is supported, got ", n));
  }
  if (const Json* v = Field(j, "best_of")) {
    ASSIGN_OR_RETURN(int64_t b, AsInt(*v, "best_of", 1, std::numeric_limits<int32_t>::max()));
    if (b != 1) return refuse("best_of", "only best_of=1 is supported");
  }
  bool echo = false;
  RETURN_IF_ERROR(ReadBool(j, "echo", &echo));
  if (echo) return refuse("echo", "echo is not supported");
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    double p = 0;
    RETURN_IF_ERROR(ReadDouble(j, name, &p));
    if (p != 0) return refuse(name, absl::StrCat(name, " is not supported (only 0)"));
  }
  double rep = 1;
  RETURN_IF_ERROR(ReadDouble(j, "repetition_penalty", &rep));
  if (rep != 1) return refuse("repetition_penalty", "repetition_penalty is not supported (only 1)");
  if (const Json* v = Field(j, "logit_bias"); v && !(v->is_object() && v->empty())) {
    return refuse("logit_bias", "logit_bias is not supported");
  }
  if (const Json* v = Field(j, "tools"); v && !(v->is_array() && v->empty())) {
    return refuse("tools", "tools are not supported");
  }
  if (const Json* v = Field(j, "suffix"); v && !(v->is_string() && v->get<std::string>().empty())) {
    return refuse("suffix", "suffix is not supported");
  }
  if (const Json* v = Field(j, "response_format")) {
    const Json* type = v->is_object() ? Field(*v, "type") : nullptr;
    if (type == nullptr || *type != "text")
      return refuse("response_format", "only response_format {\"type\": \"text\"} is supported");
  }
  return absl::OkStatus();
}

absl::Status ParseStop(const Json& j, std::vector<std::string>* stop) {
  const Json* v = Field(j, "stop");
  if (v == nullptr) return absl::OkStatus();
  if (v->is_string()) {
    stop->push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const Json& s : *v) {
      if (!s.is_string()) return WrongType("stop", "a string or a list of strings");
      stop->push_back(s.get<std::string>());
    }
  } else {
    return WrongType("stop", "a string or a list of strings");
  }
  return absl::OkStatus();
}

// The parameters common to both endpoints. `max_tokens_name` is the field that sets the
// completion budget (chat also accepts max_completion_tokens, which wins).
absl::StatusOr<GenerationParams> ParseCommon(const Json& j, bool chat) {
  GenerationParams p;
  RETURN_IF_ERROR(RefuseUnsupported(j));
  if (const Json* v = Field(j, "model")) {
    if (!v->is_string()) return WrongType("model", "a string");
    p.model = v->get<std::string>();
  }
  constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
  RETURN_IF_ERROR(ReadInt(j, "max_tokens", 1, kMaxInt32, &p.max_tokens));
  if (chat) {
    std::optional<int64_t> mct;
    RETURN_IF_ERROR(ReadInt(j, "max_completion_tokens", 1, kMaxInt32, &mct));
    if (mct) p.max_tokens = mct;
  }
  SamplingParams& s = p.sampling;
  double temperature = s.temperature, top_p = s.top_p, min_p = s.min_p;
  RETURN_IF_ERROR(ReadDouble(j, "temperature", &temperature));
  RETURN_IF_ERROR(ReadDouble(j, "top_p", &top_p));
  RETURN_IF_ERROR(ReadDouble(j, "min_p", &min_p));
  s.temperature = static_cast<float>(temperature);
  s.top_p = static_cast<float>(top_p);
  s.min_p = static_cast<float>(min_p);
  std::optional<int64_t> top_k;
  RETURN_IF_ERROR(
      ReadInt(j, "top_k", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &top_k));
  if (top_k) {
    if (*top_k < -1 || *top_k > kMaxInt32)
      return InvalidParam("top_k", absl::StrCat("'top_k' must be -1 (off) or >= 0, got ", *top_k));
    s.top_k = *top_k == -1 ? 0 : static_cast<int32_t>(*top_k);  // -1: vLLM's "off"
  }
  std::optional<int64_t> seed;
  RETURN_IF_ERROR(ReadInt(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &seed));
  if (seed) {
    s.seed = static_cast<uint64_t>(*seed);
    s.has_seed = true;
  }
  RETURN_IF_ERROR(ParseStop(j, &p.stop));
  if (const Json* v = Field(j, "stop_token_ids")) {
    if (!v->is_array()) return WrongType("stop_token_ids", "a list of token ids (integers)");
    ASSIGN_OR_RETURN(p.stop_token_ids, AsTokenIds(*v, "stop_token_ids"));
  }
  RETURN_IF_ERROR(ReadBool(j, "ignore_eos", &p.ignore_eos));
  RETURN_IF_ERROR(ReadBool(j, "stream", &p.stream));
  if (const Json* v = Field(j, "stream_options")) {
    if (!v->is_object()) return WrongType("stream_options", "an object");
    if (!p.stream) return InvalidParam("stream_options", "stream_options is only allowed when stream is true");
    RETURN_IF_ERROR(ReadBool(*v, "include_usage", &p.include_usage));
  }
  RETURN_IF_ERROR(ReadBool(j, "return_token_ids", &p.return_token_ids));
  RETURN_IF_ERROR(ReadBool(j, "skip_special_tokens", &p.skip_special_tokens));
  if (chat) {
    RETURN_IF_ERROR(ReadBool(j, "logprobs", &p.logprobs));
    std::optional<int64_t> top;
    RETURN_IF_ERROR(ReadInt(j, "top_logprobs", 0, kMaxTopLogprobs, &top));
    if (top) {
      if (*top > 0 && !p.logprobs) return InvalidParam("top_logprobs", "top_logprobs needs logprobs set to true");
      p.top_logprobs = static_cast<int32_t>(*top);
    }
  } else {
    std::optional<int64_t> n;
    if (const Json* v = Field(j, "logprobs"); v && !v->is_number()) return WrongType("logprobs", "an integer");
    RETURN_IF_ERROR(ReadInt(j, "logprobs", 0, kMaxTopLogprobs, &n));
    if (n) {
      p.logprobs = true;
      p.top_logprobs = static_cast<int32_t>(*n);
    }
  }
  RETURN_IF_ERROR(ValidateGenerationParams(p));
  return p;
}

absl::StatusOr<Json> ParseBody(std::string_view body) {
  Json j;
  try {
    j = Json::parse(body);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("request body is not valid JSON: ", e.what()));
  }
  if (!j.is_object()) return absl::InvalidArgumentError("request body must be a JSON object");
  return j;
}

absl::Status ParsePrompt(const Json& j, CompletionRequest* r) {
  const Json* v = Field(j, "prompt");
  if (v == nullptr) return InvalidParam("prompt", "'prompt' is required");
  const Json* one = v;
  if (v->is_array() && !v->empty() && !AllIntegers(*v)) {
    // A list of prompts: only a list of exactly one is accepted.
    if (v->size() != 1) return InvalidParam("prompt", "only one prompt per request is supported");
    one = &(*v)[0];
  }
  if (one->is_string()) {
    r->prompt_text = one->get<std::string>();
    if (r->prompt_text.empty()) return InvalidParam("prompt", "'prompt' must not be empty");
    return absl::OkStatus();
  }
  if (!one->is_array()) return WrongType("prompt", "a string, a list of token ids, or a list of one of those");
  if (one->empty()) return InvalidParam("prompt", "'prompt' must not be empty");
  r->prompt_is_ids = true;
  ASSIGN_OR_RETURN(r->prompt_ids, AsTokenIds(*one, "prompt"));
  return absl::OkStatus();
}

absl::StatusOr<std::string> MessageContent(const Json& content, size_t idx) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    return WrongType("messages", "a list of {role, content} objects with string or text-part content");
  std::vector<std::string> texts;
  for (const Json& part : content) {
    const Json* type = part.is_object() ? Field(part, "type") : nullptr;
    const Json* text = part.is_object() ? Field(part, "text") : nullptr;
    if (type == nullptr || *type != "text" || text == nullptr || !text->is_string()) {
      return InvalidParam("messages", absl::StrCat("messages[", idx, "]: only text content parts are supported"));
    }
    texts.push_back(text->get<std::string>());
  }
  return absl::StrJoin(texts, "\n");
}

absl::Status ParseMessages(const Json& j, ChatRequest* r) {
  const Json* v = Field(j, "messages");
  if (v == nullptr) return InvalidParam("messages", "'messages' is required");
  if (!v->is_array()) return WrongType("messages", "a list of messages");
  if (v->empty()) return InvalidParam("messages", "'messages' must not be empty");
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& m = (*v)[i];
    const Json* role = m.is_object() ? Field(m, "role") : nullptr;
    if (role == nullptr || !role->is_string()) {
      return InvalidParam("messages", absl::StrCat("messages[", i, "] must be an object with a string 'role'"));
    }
    ChatMessage msg;
    msg.role = role->get<std::string>();
    if (msg.role == "developer") msg.role = "system";
    if (const Json* c = Field(m, "content")) {
      ASSIGN_OR_RETURN(msg.content, MessageContent(*c, i));
    } else if (msg.role != "assistant") {  // only an assistant turn may come without content
      return InvalidParam("messages", absl::StrCat("messages[", i, "] (", msg.role, ") needs 'content'"));
    }
    r->messages.push_back(std::move(msg));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateGenerationParams(const GenerationParams& p) {
  const SamplingParams& s = p.sampling;
  if (!(s.temperature >= 0 && s.temperature <= 2)) {
    return InvalidParam("temperature", absl::StrCat("'temperature' must be in [0, 2], got ", s.temperature));
  }
  if (!(s.top_p > 0 && s.top_p <= 1))
    return InvalidParam("top_p", absl::StrCat("'top_p' must be in (0, 1], got ", s.top_p));
  if (!(s.min_p >= 0 && s.min_p <= 1))
    return InvalidParam("min_p", absl::StrCat("'min_p' must be in [0, 1], got ", s.min_p));
  if (s.top_k < 0) return InvalidParam("top_k", absl::StrCat("'top_k' must be -1 (off) or >= 0, got ", s.top_k));
  if (p.max_tokens && *p.max_tokens < 1) {
    return InvalidParam("max_tokens", absl::StrCat("'max_tokens' must be at least 1, got ", *p.max_tokens));
  }
  if (p.stop.size() > kMaxStopStrings) {
    return InvalidParam("stop",
                        absl::StrCat("at most ", kMaxStopStrings, " stop strings are allowed, got ", p.stop.size()));
  }
  for (const std::string& s : p.stop) {
    if (s.empty()) return InvalidParam("stop", "stop strings must not be empty");
  }
  for (int32_t id : p.stop_token_ids) {
    if (id < 0) return InvalidParam("stop_token_ids", absl::StrCat("stop_token_ids must be >= 0, got ", id));
  }
  if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs) {
    return InvalidParam("top_logprobs",
                        absl::StrCat("top_logprobs must be in [0, ", kMaxTopLogprobs, "], got ", p.top_logprobs));
  }
  return absl::OkStatus();
}

absl::Status CheckModelName(const std::string& requested, const std::string& served) {
  if (requested.empty() || requested == served) return absl::OkStatus();
  return WithErrorCode(WithParam(absl::NotFoundError(absl::StrCat(
                                     "The model `", requested, "` does not exist (this server serves `", served, "`)")),
                                 "model"),
                       "model_not_found");
}

absl::StatusOr<CompletionRequest> ParseCompletionRequest(std::string_view body) {
  ASSIGN_OR_RETURN(Json j, ParseBody(body));
  CompletionRequest r;
  RETURN_IF_ERROR(ParsePrompt(j, &r));
  RETURN_IF_ERROR(ReadBool(j, "allow_special_tokens", &r.allow_special_tokens));
  ASSIGN_OR_RETURN(r.params, ParseCommon(j, /*chat=*/false));
  return r;
}

absl::StatusOr<ChatRequest> ParseChatRequest(std::string_view body) {
  ASSIGN_OR_RETURN(Json j, ParseBody(body));
  ChatRequest r;
  RETURN_IF_ERROR(ParseMessages(j, &r));
  ASSIGN_OR_RETURN(r.params, ParseCommon(j, /*chat=*/true));
  RETURN_IF_ERROR(ReadBool(j, "add_generation_prompt", &r.chat_options.add_generation_prompt));
  if (const Json* kw = Field(j, "chat_template_kwargs")) {
    if (!kw->is_object()) return WrongType("chat_template_kwargs", "an object");
    RETURN_IF_ERROR(ReadBool(*kw, "enable_thinking", &r.chat_options.enable_thinking));
  }
  return r;
}

}  // namespace moeshard::router
