// Bad requests: each gets a 4xx with OpenAI's error body, and the cluster keeps serving.
// API keys (--api-key): a missing or wrong key is a 401 in the same body; /metrics and the
// detailed /ready need it too (a bare /health and /ready stay open).
#include "absl/strings/str_cat.h"
#include "tests/itest/suite.h"
#include "common/status.h"

namespace moeshard::itest {
namespace {

struct BadRequestCase {
  BadRequestCase(std::string n, std::string p, std::string b, int status, std::string code = "")
      : name(std::move(n)), path(std::move(p)), body(std::move(b)), want_status(status), want_code(std::move(code)) {}
  std::string name, path;
  std::string body;       // sent as is
  int want_status = 0;    // 0: any 4xx
  std::string want_code;  // error.code, or empty
};

std::vector<BadRequestCase> BadRequests(const Context& ctx) {
  const std::string m = Json(ctx.model_name).dump();
  const std::string ok_prompt = "[1, 2, 3]";
  auto completion = [&](const std::string& fields) {
    return absl::StrCat("{\"model\": ", m, ", \"prompt\": ", ok_prompt, ", \"max_tokens\": 4", fields, "}");
  };
  auto chat = [&](const std::string& fields) {
    return absl::StrCat("{\"model\": ", m, ", \"max_tokens\": 4", fields, "}");
  };
  const std::string hello = ", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]";
  std::vector<BadRequestCase> v = {
      {"malformed JSON", "/v1/completions", absl::StrCat("{\"model\": ", m, ", \"prompt\": [1, 2"), 400},
      {"body is not an object", "/v1/completions", "[1, 2, 3]", 400},
      {"prompt of the wrong type", "/v1/completions", absl::StrCat("{\"model\": ", m, ", \"prompt\": 5}"), 400},
      {"empty prompt", "/v1/completions", absl::StrCat("{\"model\": ", m, ", \"prompt\": [], \"max_tokens\": 4}"), 400},
      {"max_tokens of the wrong type", "/v1/completions", completion(", \"max_tokens\": \"ten\""), 400},
      {"max_tokens not an integer", "/v1/completions", completion(", \"max_tokens\": 1.5"), 400},
      {"negative max_tokens", "/v1/completions", completion(", \"max_tokens\": -1"), 400},
      {"huge max_tokens", "/v1/completions", completion(", \"max_tokens\": 1000000000000"), 400},
      {"temperature of the wrong type", "/v1/completions", completion(", \"temperature\": \"hot\""), 400},
      {"temperature below 0", "/v1/completions", completion(", \"temperature\": -0.5"), 400},
      {"temperature above 2", "/v1/completions", completion(", \"temperature\": 2.5"), 400},
      {"top_p above 1", "/v1/completions", completion(", \"top_p\": 1.5"), 400},
      {"logprobs above the limit", "/v1/completions", completion(", \"logprobs\": 1000"), 400},
      {"negative token id", "/v1/completions",
       absl::StrCat("{\"model\": ", m, ", \"prompt\": [1, -5], \"max_tokens\": 4}"), 400},
      {"stream of a bad request", "/v1/completions", completion(", \"stream\": true, \"temperature\": -1"), 400},
      {"unknown model", "/v1/completions", "{\"model\": \"no-such-model\", \"prompt\": [1, 2], \"max_tokens\": 4}", 404,
       "model_not_found"},
      {"chat: empty messages", "/v1/chat/completions", chat(", \"messages\": []"), 400},
      {"chat: messages of the wrong type", "/v1/chat/completions", chat(", \"messages\": \"hi\""), 400},
      {"chat: a message without content", "/v1/chat/completions", chat(", \"messages\": [{\"role\": \"user\"}]"), 400},
      {"chat: unknown role", "/v1/chat/completions",
       chat(", \"messages\": [{\"role\": \"wizard\", \"content\": \"hi\"}]"), 400},
      {"chat: temperature out of range", "/v1/chat/completions", chat(absl::StrCat(hello, ", \"temperature\": 9")),
       400},
  };
  if (ctx.vocab > 0) {
    v.push_back({"token id outside the vocabulary", "/v1/completions",
                 absl::StrCat("{\"model\": ", m, ", \"prompt\": [1, ", ctx.vocab, "], \"max_tokens\": 4}"), 400});
  }
  return v;
}

absl::Status PromptTooLong(Context& ctx) {
  const int64_t n = ctx.max_model_len > 0 ? ctx.max_model_len + 1 : 200001;
  Json body = {{"model", ctx.model_name}, {"prompt", std::vector<int32_t>(n, 1)}, {"max_tokens", 1}};
  HttpResponse r = ctx.http.PostJson("/v1/completions", body);
  RETURN_IF_ERROR(CheckErrorBody(r, 400));
  Json e = Json::parse(r.body)["error"];
  if (e.value("code", Json()) != "context_length_exceeded") {
    return absl::InternalError(absl::StrCat("error.code is not context_length_exceeded: ", r.Describe()));
  }
  const std::string msg = e["message"];
  if (msg.find(std::to_string(n)) == std::string::npos) {
    return absl::InternalError(absl::StrCat("the message does not name the prompt's ", n, " tokens: ", msg));
  }
  return absl::OkStatus();
}

absl::Status NeedsKey(Context& ctx, const std::string& method, const std::string& path, Auth auth) {
  Json body = {{"model", ctx.model_name}, {"prompt", {1, 2, 3}}, {"max_tokens", 2}};
  HttpResponse r = method == "GET" ? ctx.http.Get(path, auth) : ctx.http.PostJson(path, body, auth);
  return CheckErrorBody(r, 401);
}

absl::Status Open(Context& ctx, const std::string& path) {
  HttpResponse r = ctx.http.Get(path, Auth::kNone);
  if (r.status != 200) return absl::InternalError(absl::StrCat("GET ", path, " without a key: ", r.Describe()));
  return absl::OkStatus();
}

}  // namespace

void RunErrorChecks(Context& ctx, Suite& suite) {
  for (const BadRequestCase& b : BadRequests(ctx)) {
    suite.Run(absl::StrCat("bad request: ", b.name), [&]() -> absl::Status {
      HttpResponse r = ctx.http.Post(b.path, b.body);
      RETURN_IF_ERROR(CheckErrorBody(r, b.want_status));
      if (!b.want_code.empty() && Json::parse(r.body)["error"].value("code", Json()) != b.want_code) {
        return absl::InternalError(absl::StrCat("error.code is not ", b.want_code, ": ", r.Describe()));
      }
      return absl::OkStatus();
    });
  }
  suite.Run("bad request: prompt too long -> 400 context_length_exceeded", [&] { return PromptTooLong(ctx); });
  suite.Run("bad requests: the cluster still serves", [&] { return StillServes(ctx, false, 9, 3); });

  const bool key = !ctx.opts.api_key.empty();
  auto with_key = [&](const std::function<absl::Status()>& f) { return key ? f() : Skip("needs --api-key"); };
  suite.Run("api key: POST /v1/completions without a key -> 401",
            [&] { return with_key([&] { return NeedsKey(ctx, "POST", "/v1/completions", Auth::kNone); }); });
  suite.Run("api key: POST /v1/completions with a wrong key -> 401",
            [&] { return with_key([&] { return NeedsKey(ctx, "POST", "/v1/completions", Auth::kWrongKey); }); });
  suite.Run("api key: POST /v1/chat/completions without a key -> 401",
            [&] { return with_key([&] { return NeedsKey(ctx, "POST", "/v1/chat/completions", Auth::kNone); }); });
  suite.Run("api key: GET /v1/models with a wrong key -> 401",
            [&] { return with_key([&] { return NeedsKey(ctx, "GET", "/v1/models", Auth::kWrongKey); }); });
  suite.Run("api key: /health stays open; /metrics needs the key", [&] {
    return with_key([&]() -> absl::Status {
      RETURN_IF_ERROR(Open(ctx, "/health"));
      return NeedsKey(ctx, "GET", "/metrics", Auth::kNone);
    });
  });
  suite.Run("api key: /ready without the key shows no pools or addresses", [&] {
    return with_key([&]() -> absl::Status {
      HttpResponse r = ctx.http.Get("/ready", Auth::kNone);
      ASSIGN_OR_RETURN(Json j, r.JsonBody());
      if (r.status != 200 || j.contains("pools") || !j.value("ready", false)) {
        return absl::InternalError(absl::StrCat("GET /ready without a key: ", r.Describe()));
      }
      return absl::OkStatus();
    });
  });
}

}  // namespace moeshard::itest
