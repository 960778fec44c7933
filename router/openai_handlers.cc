#include "router/openai_handlers.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "router/api_error.h"
#include "router/log.h"
#include "router/openai_request.h"
#include "router/openai_response.h"
#include "router/prompt.h"

namespace moeshard::router {
namespace {

using Api = ResponseFormatter::Api;
using Json = nlohmann::json;

// Everything a streaming response needs after the handler returned.
struct StreamState {
  std::unique_ptr<Generation> generation;
  GenerationParams params;
  std::vector<int32_t> prompt_ids;
  std::unique_ptr<ResponseFormatter> formatter;
};

void Reject(const RouterServices& s, const std::string& request_id, httplib::Response& res, const absl::Status& st) {
  s.metrics->RequestRejected(kNoPool, absl::IsNotFound(st) ? "model_not_found" : "bad_request");
  LogLine(request_id, absl::StrCat("bad request: ", st.message()));
  SendError(res, st);
}

void ServeJson(const RouterServices& s, const std::string& request_id, Generation& gen, ResponseFormatter& formatter,
               httplib::Response& res) {
  std::string text;
  std::vector<TokenInfo> tokens;
  auto result = gen.Run([&](const GenerationDelta& d) {
    text += d.text;
    tokens.insert(tokens.end(), d.tokens.begin(), d.tokens.end());
    return true;
  });
  if (!result.ok()) {
    SendError(res, result.status());
    return;
  }
  res.set_content(DumpJson(formatter.Full(text, tokens, *result)), "application/json");
}

// Runs the generation inside httplib's content provider: headers (200) are out by then.
bool StreamEvents(StreamState& state, const std::string& request_id, Api api, httplib::DataSink& sink) {
  auto write = [&sink](const std::string& event) {
    return sink.is_writable() && sink.write(event.data(), event.size());
  };
  ResponseFormatter& f = *state.formatter;
  if (api == Api::kChat && !write(SseEvent(f.RoleChunk()))) return false;  // gone before the first token
  auto result = state.generation->Run([&](const GenerationDelta& d) { return write(SseEvent(f.DeltaChunk(d))); });
  if (!result.ok()) {
    if (absl::IsCancelled(result.status())) return false;  // the client is gone: drop the connection
    write(SseEvent(ToHttpError(result.status()).body));
    write(kSseDone);
    sink.done();
    return true;
  }
  bool ok = write(SseEvent(f.FinalChunk(*result)));
  if (ok && state.params.include_usage) ok = write(SseEvent(f.UsageChunk(*result)));
  if (ok) ok = write(kSseDone);
  if (!ok) {
    LogLine(request_id, "client went away before the end of the stream");
    return false;
  }
  sink.done();
  return true;
}

void Serve(const RouterServices& s, const std::string& request_id, Api api, GenerationParams params,
           absl::StatusOr<std::vector<int32_t>> prompt_ids, httplib::Response& res) {
  if (!prompt_ids.ok()) return Reject(s, request_id, res, prompt_ids.status());
  auto state = std::make_shared<StreamState>();
  state->params = params;
  state->prompt_ids = *prompt_ids;
  auto gen = Generation::Start(s, PreparedRequest{request_id, *std::move(prompt_ids), std::move(params)});
  if (!gen.ok()) {
    absl::Status st = gen.status();
    if (ErrorCode(st) == "context_length_exceeded") st = WithParam(st, api == Api::kChat ? "messages" : "prompt");
    SendError(res, st);
    return;
  }
  state->generation = *std::move(gen);
  state->formatter =
      std::make_unique<ResponseFormatter>(api, absl::StrCat(api == Api::kChat ? "chatcmpl-" : "cmpl-", request_id),
                                          s.served_model_name, s.tokenizer, state->params, state->prompt_ids);
  if (!state->params.stream) {
    ServeJson(s, request_id, *state->generation, *state->formatter, res);
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [state, request_id, api](size_t /*offset*/, httplib::DataSink& sink) {
        return StreamEvents(*state, request_id, api, sink);
      },
      [state](bool /*success*/) { state->generation.reset(); });
}

}  // namespace

void SendError(httplib::Response& res, const absl::Status& status) {
  HttpError e = ToHttpError(status);
  res.status = e.http_status;
  if (e.http_status == 503) res.set_header("Retry-After", "1");
  res.set_content(DumpJson(e.body), "application/json");
}

void HandleCompletions(const RouterServices& s, const std::string& request_id, const httplib::Request& req,
                       httplib::Response& res) {
  auto request = ParseCompletionRequest(req.body);
  if (!request.ok()) return Reject(s, request_id, res, request.status());
  if (absl::Status st = CheckModelName(request->params.model, s.served_model_name); !st.ok()) {
    return Reject(s, request_id, res, st);
  }
  Serve(s, request_id, Api::kCompletion, request->params, CompletionPromptIds(s.tokenizer, *request, s.max_prompt_bytes), res);
}

void HandleChatCompletions(const RouterServices& s, const std::string& request_id, const httplib::Request& req,
                           httplib::Response& res) {
  auto request = ParseChatRequest(req.body);
  if (!request.ok()) return Reject(s, request_id, res, request.status());
  if (absl::Status st = CheckModelName(request->params.model, s.served_model_name); !st.ok()) {
    return Reject(s, request_id, res, st);
  }
  Serve(s, request_id, Api::kChat, request->params, ChatPromptIds(s.tokenizer, *request, s.max_prompt_bytes), res);
}

}  // namespace moeshard::router
