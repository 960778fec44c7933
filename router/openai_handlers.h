// POST /v1/completions and /v1/chat/completions: parse, tokenize, dispatch, and answer
// with one JSON body or a stream of server-sent events.
//
// A stream writes each coordinator update as a chunk as soon as it arrives; a write that
// fails (the client went away) makes the generation cancel its coordinator call. Errors
// found before the stream starts get an HTTP status; errors after it started are sent as
// one `data: {"error": ...}` event before `data: [DONE]`.
#pragma once

#include <string>

#include "router/generation.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace moeshard::router {

void HandleCompletions(const RouterServices& services, const std::string& request_id, const httplib::Request& req,
                       httplib::Response& res);
void HandleChatCompletions(const RouterServices& services, const std::string& request_id, const httplib::Request& req,
                           httplib::Response& res);

// Writes the OpenAI error body for a non-OK status (503 also gets Retry-After).
void SendError(httplib::Response& res, const absl::Status& status);

}  // namespace moeshard::router
