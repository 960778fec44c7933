#include "common/openai_client/openai_api.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/splitmix64.h"
#include "common/status.h"

namespace moeshard::openai_client {
namespace {

absl::Status Bad(const std::string& what, const Json& j) {
  std::string s = j.dump();
  if (s.size() > 300) s = s.substr(0, 300) + "...";
  return absl::InvalidArgumentError(absl::StrCat(what, " in ", s));
}

absl::Status ReadIds(const Json& j, std::vector<int32_t>* out) {
  if (!j.is_array()) return Bad("token ids are not an array", j);
  for (const auto& v : j) {
    if (!v.is_number_integer()) return Bad("a token id is not an integer", j);
    out->push_back(v.get<int32_t>());
  }
  return absl::OkStatus();
}

absl::Status ReadUsage(const Json& u, GenResult* g) {
  if (!u.is_object()) return Bad("usage is not an object", u);
  for (const char* k : {"prompt_tokens", "completion_tokens", "total_tokens"}) {
    if (!u.contains(k) || !u[k].is_number_integer()) return Bad(absl::StrCat("usage.", k, " missing"), u);
  }
  g->prompt_tokens = u["prompt_tokens"];
  g->completion_tokens = u["completion_tokens"];
  if (u["total_tokens"].get<int64_t>() != g->prompt_tokens + g->completion_tokens) {
    return Bad("usage.total_tokens != prompt_tokens + completion_tokens", u);
  }
  if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object()) {
    const Json& d = u["prompt_tokens_details"];
    if (d.contains("cached_tokens") && d["cached_tokens"].is_number_integer()) g->cached_tokens = d["cached_tokens"];
  }
  return absl::OkStatus();
}

absl::Status CheckFinish(const Json& c) {
  if (!c.contains("finish_reason") || !c["finish_reason"].is_string()) return Bad("finish_reason missing", c);
  std::string f = c["finish_reason"];
  if (f != "stop" && f != "length") return Bad(absl::StrCat("finish_reason '", f, "' is neither stop nor length"), c);
  return absl::OkStatus();
}

// The fields of one choice (or one chunk's choice) that both APIs share.
absl::Status ReadChoice(const Json& j, const Json& c, bool chat, bool stream, GenResult* g) {
  if (!c.is_object() || !c.contains("index") || c["index"] != 0) return Bad("choice without index 0", c);
  if (chat) {
    const char* key = stream ? "delta" : "message";
    if (!c.contains(key) || !c[key].is_object()) return Bad(absl::StrCat("choice without ", key), c);
    const Json& m = c[key];
    if (!stream && m.value("role", "") != "assistant") return Bad("message.role is not 'assistant'", c);
    if (m.contains("content") && m["content"].is_string()) {
      g->text += m["content"].get<std::string>();
      if (stream) g->deltas.push_back(m["content"]);
    } else if (!stream) {
      return Bad("message.content is not a string", c);
    }
  } else {
    if (!c.contains("text") || !c["text"].is_string()) return Bad("choice.text is not a string", c);
    g->text += c["text"].get<std::string>();
    if (stream) g->deltas.push_back(c["text"]);
  }
  if (c.contains("token_ids") && !c["token_ids"].is_null()) RETURN_IF_ERROR(ReadIds(c["token_ids"], &g->token_ids));
  for (const Json* src : {&c, &j}) {
    if (g->prompt_token_ids.empty() && src->contains("prompt_token_ids") && !(*src)["prompt_token_ids"].is_null()) {
      RETURN_IF_ERROR(ReadIds((*src)["prompt_token_ids"], &g->prompt_token_ids));
    }
  }
  if (c.contains("finish_reason") && !c["finish_reason"].is_null()) {
    if (!g->finish_reason.empty()) return Bad("finish_reason set on two chunks", c);
    RETURN_IF_ERROR(CheckFinish(c));
    g->finish_reason = c["finish_reason"];
  }
  return absl::OkStatus();
}

absl::Status ReadResponse(const Json& j, bool chat, GenResult* g) {
  const std::string object = chat ? "chat.completion" : "text_completion";
  if (!j.is_object() || j.value("object", "") != object) return Bad(absl::StrCat("object is not '", object, "'"), j);
  if (!j.contains("id") || !j["id"].is_string()) return Bad("id missing", j);
  if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].size() != 1) return Bad("not one choice", j);
  const Json& c = j["choices"][0];
  RETURN_IF_ERROR(ReadChoice(j, c, chat, false, g));
  if (g->finish_reason.empty()) return Bad("finish_reason missing", c);
  if (c.contains("logprobs")) g->logprobs = c["logprobs"];
  if (!j.contains("usage")) return Bad("usage missing", j);
  RETURN_IF_ERROR(ReadUsage(j["usage"], g));
  g->response = j;
  return absl::OkStatus();
}

}  // namespace

Json OpenAiApi::CompletionBody(const GenRequest& r, bool stream) const {
  Json b = {{"model", model_},          {"max_tokens", r.max_tokens},
            {"temperature", 0},         {"ignore_eos", r.ignore_eos},
            {"return_token_ids", true}, {"stream", stream}};
  if (r.prompt_ids.empty()) {
    b["prompt"] = r.prompt_text;
  } else {
    b["prompt"] = r.prompt_ids;
  }
  if (stream) b["stream_options"] = {{"include_usage", true}};
  for (auto it = r.extra.begin(); it != r.extra.end(); ++it) b[it.key()] = it.value();
  return b;
}

void OpenAiApi::Count(const GenResult& g) const {
  if (tally_ == nullptr || g.finish_reason.empty()) return;
  tally_->prompt_tokens += std::max<int64_t>(0, g.prompt_tokens >= 0 ? g.prompt_tokens : g.prompt_token_ids.size());
  tally_->cached_tokens += std::max<int64_t>(0, g.cached_tokens);
  tally_->generation_tokens += g.completion_tokens >= 0 ? g.completion_tokens : g.token_ids.size();
  tally_->finished += 1;
}

absl::StatusOr<GenResult> OpenAiApi::Complete(const GenRequest& r) const {
  HttpResponse res = http_->PostJson("/v1/completions", CompletionBody(r, false));
  if (res.status != 200) return absl::UnavailableError(absl::StrCat("POST /v1/completions: ", res.Describe()));
  ASSIGN_OR_RETURN(Json j, res.JsonBody());
  GenResult g;
  RETURN_IF_ERROR(ReadResponse(j, false, &g));
  if (g.completion_tokens != static_cast<int64_t>(g.token_ids.size())) {
    return Bad(absl::StrCat("usage.completion_tokens ", g.completion_tokens, " but ", g.token_ids.size(), " token_ids"),
               j);
  }
  Count(g);
  return g;
}

namespace {

// Collects a completion or chat stream; `keep_going` may stop it early.
absl::StatusOr<GenResult> Stream(const HttpClient& http, const std::string& path, const Json& body, bool chat,
                                 const std::function<bool(int64_t)>& keep_going) {
  GenResult g;
  absl::Status err = absl::OkStatus();
  bool done = false, stopped = false;
  const std::string object = chat ? "chat.completion.chunk" : "text_completion";
  HttpResponse res = http.PostStream(path, body, [&](const std::string& data) {
    if (!err.ok()) return false;
    if (done) {
      err = absl::InvalidArgumentError(absl::StrCat("an event after [DONE]: ", data.substr(0, 200)));
      return false;
    }
    if (data == "[DONE]") {
      done = true;
      return true;
    }
    Json j = Json::parse(data, nullptr, false);
    if (j.is_discarded()) {
      err = absl::InvalidArgumentError(absl::StrCat("an SSE event is not JSON: '", data.substr(0, 200), "'"));
      return false;
    }
    if (j.contains("error")) {
      err = Bad("the stream carried an error", j);
      return false;
    }
    if (j.value("object", "") != object || !j.contains("choices") || !j["choices"].is_array()) {
      err = Bad(absl::StrCat("chunk is not a '", object, "' with choices"), j);
      return false;
    }
    ++g.num_chunks;
    for (const auto& c : j["choices"]) {
      absl::Status st = ReadChoice(j, c, chat, true, &g);
      if (!st.ok()) {
        err = st;
        return false;
      }
    }
    if (j.contains("usage") && !j["usage"].is_null()) {
      absl::Status st = ReadUsage(j["usage"], &g);
      if (!st.ok()) {
        err = st;
        return false;
      }
    }
    if (keep_going && !keep_going(g.num_chunks)) {
      stopped = true;
      return false;
    }
    return true;
  });
  if (res.status != 200) return absl::UnavailableError(absl::StrCat("POST ", path, " (stream): ", res.Describe()));
  RETURN_IF_ERROR(err);
  if (stopped) {
    g.finish_reason.clear();
    return g;
  }
  if (!res.error.empty()) return absl::UnavailableError(absl::StrCat("stream ", path, ": ", res.error));
  if (res.content_type.rfind("text/event-stream", 0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("stream Content-Type is '", res.content_type, "'"));
  }
  if (!done) return absl::InvalidArgumentError("the stream did not end with data: [DONE]");
  if (g.finish_reason.empty()) return absl::InvalidArgumentError("no chunk set finish_reason");
  return g;
}

}  // namespace

absl::StatusOr<GenResult> OpenAiApi::CompleteStream(const GenRequest& r,
                                                    const std::function<bool(int64_t)>& keep_going) const {
  ASSIGN_OR_RETURN(GenResult g, Stream(*http_, "/v1/completions", CompletionBody(r, true), false, keep_going));
  if (!g.finish_reason.empty()) {
    if (g.completion_tokens >= 0 && g.completion_tokens != static_cast<int64_t>(g.token_ids.size())) {
      return absl::InvalidArgumentError(absl::StrCat("stream: usage.completion_tokens ", g.completion_tokens, " but ",
                                                     g.token_ids.size(), " token_ids arrived"));
    }
    Count(g);
  }
  return g;
}

absl::StatusOr<GenResult> OpenAiApi::Chat(const Json& messages, int64_t max_tokens, const Json& extra,
                                          bool stream) const {
  Json b = {
      {"model", model_}, {"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}, {"stream", stream}};
  if (stream) b["stream_options"] = {{"include_usage", true}};
  for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
  GenResult g;
  if (stream) {
    ASSIGN_OR_RETURN(g, Stream(*http_, "/v1/chat/completions", b, true, nullptr));
  } else {
    HttpResponse res = http_->PostJson("/v1/chat/completions", b);
    if (res.status != 200) return absl::UnavailableError(absl::StrCat("POST /v1/chat/completions: ", res.Describe()));
    ASSIGN_OR_RETURN(Json j, res.JsonBody());
    RETURN_IF_ERROR(ReadResponse(j, true, &g));
  }
  Count(g);
  return g;
}

absl::Status CheckErrorBody(const HttpResponse& r, int want_status) {
  if (r.status == 0) return absl::UnavailableError(r.Describe());
  if (want_status != 0 && r.status != want_status) {
    return absl::InvalidArgumentError(absl::StrCat("want HTTP ", want_status, ", got ", r.Describe()));
  }
  if (r.status < 400 || r.status >= 500)
    return absl::InvalidArgumentError(absl::StrCat("want a 4xx, got ", r.Describe()));
  Json j = Json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("error") || !j["error"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("no OpenAI error body: ", r.Describe()));
  }
  const Json& e = j["error"];
  if (!e.contains("message") || !e["message"].is_string() || e["message"].get<std::string>().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("error.message missing: ", r.Describe()));
  }
  if (!e.contains("type") || !e["type"].is_string())
    return absl::InvalidArgumentError(absl::StrCat("error.type missing: ", r.Describe()));
  for (const char* k : {"param", "code"}) {
    if (!e.contains(k) || !(e[k].is_null() || e[k].is_string() || e[k].is_number_integer())) {
      return absl::InvalidArgumentError(absl::StrCat("error.", k, " missing (null or a string): ", r.Describe()));
    }
  }
  return absl::OkStatus();
}

std::vector<int32_t> MakePrompt(int64_t len, uint64_t seed, int64_t vocab) {
  std::vector<int32_t> ids(len);
  SplitMix64Rng rng(seed * kSplitMix64Gamma + 0x632BE59BD9B4E019ull);
  for (auto& id : ids) id = static_cast<int32_t>(rng.Next() % static_cast<uint64_t>(vocab));
  return ids;
}

std::string FormatIds(const std::vector<int32_t>& ids) {
  if (ids.size() <= 16) return absl::StrCat("[", absl::StrJoin(ids, " "), "]");
  std::vector<int32_t> head(ids.begin(), ids.begin() + 12);
  return absl::StrCat("[", absl::StrJoin(head, " "), " ... ", ids.back(), "] (", ids.size(), " ids)");
}

std::string DescribeDiff(const std::vector<int32_t>& want, const std::vector<int32_t>& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  std::string at = i < want.size() && i < got.size() ? absl::StrCat(": want ", want[i], ", got ", got[i]) : "";
  return absl::StrCat(got.size(), " tokens vs ", want.size(), " expected, first difference at index ", i, at, "; want ",
                      FormatIds(want), ", got ", FormatIds(got));
}

}  // namespace moeshard::openai_client
