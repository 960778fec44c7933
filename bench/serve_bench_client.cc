#include "bench/serve_bench_client.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/openai_client/openai_api.h"

namespace moeshard::bench {
namespace {

using Clock = std::chrono::steady_clock;
using openai_client::Json;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Replaces every byte that is not part of well-formed UTF-8 by '?': a server that cuts a
// multi-byte character between two chunks still sends a chunk we can count.
std::string ValidUtf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool good = n > 0 && i + n <= s.size();
    for (size_t k = 1; good && k < n; ++k) good = (static_cast<unsigned char>(s[i + k]) >> 6) == 2;
    if (good) {
      out.append(s, i, n);
      i += n;
    } else {
      out += '?';
      ++i;
    }
  }
  return out;
}

// The content tokens of one chunk: token ids when the server sends them, else one per
// non-empty text piece (llama-server and vLLM send one token per chunk).
int64_t ContentTokens(const Json& j) {
  int64_t n = 0;
  if (!j.contains("choices") || !j["choices"].is_array()) return 0;
  for (const Json& ch : j["choices"]) {
    if (!ch.is_object()) continue;
    if (ch.contains("token_ids") && ch["token_ids"].is_array()) {
      n += static_cast<int64_t>(ch["token_ids"].size());
    } else if (ch.contains("text") && ch["text"].is_string() && !ch["text"].get<std::string>().empty()) {
      n += 1;
    }
  }
  return n;
}

void ReadUsage(const Json& j, Timing* t) {
  if (!j.contains("usage") || !j["usage"].is_object()) return;
  const Json& u = j["usage"];
  if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer()) t->prompt_tokens = u["prompt_tokens"];
  if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer()) {
    t->output_tokens = u["completion_tokens"];
    t->usage_seen = true;
  }
}

Timing RunUnstreamed(const openai_client::HttpClient& http, const Json& body) {
  Timing t;
  const auto t0 = Clock::now();
  openai_client::HttpResponse r = http.PostJson("/v1/completions", body);
  t.e2e_s = t.ttft_s = Seconds(t0, Clock::now());
  if (r.status != 200) {
    t.error = r.status == 0 ? absl::StrCat("no response: ", r.error) : r.Describe();
    return t;
  }
  Json j = Json::parse(ValidUtf8(r.body), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    t.error = absl::StrCat("HTTP 200 with a body that is not JSON: '", Escaped(r.body), "'");
    return t;
  }
  ReadUsage(j, &t);
  if (!t.usage_seen) {
    t.error = absl::StrCat("HTTP 200 without usage.completion_tokens: '", Escaped(r.body), "'");
    return t;
  }
  t.ok = true;
  return t;
}

}  // namespace

std::string Escaped(const std::string& s, size_t max) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > max) absl::StrAppend(&out, "... (", s.size(), " bytes)");
  return out;
}

Json RequestBody(const RequestConfig& c, int64_t i) {
  Json body = {{"model", c.model},
               {"prompt", openai_client::MakePrompt(c.prompt_len, c.seed * 1000003 + i, c.vocab)},
               {"max_tokens", c.output_len},
               {"temperature", 0},
               {"ignore_eos", c.ignore_eos},
               {"return_token_ids", true},
               {"stream", c.stream}};
  if (c.stream) body["stream_options"] = {{"include_usage", true}};
  return body;
}

Timing RunRequest(const RequestConfig& c, const openai_client::HttpClient& http, int64_t i) {
  const Json body = RequestBody(c, i);
  if (!c.stream) return RunUnstreamed(http, body);
  Timing t;
  int64_t counted = 0, events = 0;
  bool done = false;
  std::string failure, last_event;
  const auto t0 = Clock::now();
  Clock::time_point last;
  openai_client::HttpResponse r = http.PostStream("/v1/completions", body, [&](const std::string& data) {
    ++events;
    last_event = data;
    if (data == "[DONE]") {
      done = true;
      return true;
    }
    if (done) {
      failure = absl::StrCat("an event after [DONE]: '", Escaped(data), "'");
      return false;
    }
    Json j = Json::parse(data, nullptr, false);
    if (j.is_discarded()) j = Json::parse(ValidUtf8(data), nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      failure = absl::StrCat("event ", events, " is not a JSON object: '", Escaped(data), "'");
      return false;
    }
    if (j.contains("error")) {
      failure = absl::StrCat("error event: ", Escaped(j["error"].dump(), 400));
      return false;
    }
    ReadUsage(j, &t);
    const int64_t n = ContentTokens(j);
    if (n == 0) return true;
    const auto now = Clock::now();
    if (t.chunks == 0) {
      t.ttft_s = Seconds(t0, now);
    } else {  // a chunk of n tokens counts as n gaps of an n-th each
      t.itl_s.insert(t.itl_s.end(), n, Seconds(last, now) / n);
    }
    last = now;
    ++t.chunks;
    counted += n;
    return true;
  });
  t.e2e_s = Seconds(t0, Clock::now());
  if (!t.usage_seen) t.output_tokens = counted;
  if (r.status == 0) {
    t.error = absl::StrCat("no response: ", r.error);
  } else if (r.status != 200) {
    t.error = r.Describe();
  } else if (!failure.empty()) {
    t.error = failure;
  } else if (!r.error.empty()) {
    t.error = absl::StrCat(r.error, " (after ", events, " events)");
  } else if (!done) {
    t.error = absl::StrCat("stream ended without [DONE] after ", events, " events; the last: '",
                           Escaped(last_event), "'");
  } else if (t.chunks == 0) {
    t.error = "stream carried no content";
  }
  t.ok = t.error.empty();
  return t;
}

}  // namespace moeshard::bench
