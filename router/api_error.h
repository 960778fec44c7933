// Errors of the public APIs, carried in absl::Status. The status code picks the HTTP
// status (and the gRPC code, which shares absl's numbering); two payloads carry what
// OpenAI's error body adds: the offending parameter and a machine-readable code.
//
//   InvalidArgument -> 400 invalid_request_error     Unauthenticated -> 401
//   NotFound        -> 404 (model_not_found)         Unavailable     -> 503 (Retry-After)
//   anything else   -> 500 server_error
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace moeshard::router {

// An InvalidArgument status naming the parameter (and optionally an error code).
absl::Status InvalidParam(absl::string_view param, absl::string_view message, absl::string_view code = "");

// Returns `status` with the parameter / error code attached (kept when already set).
absl::Status WithParam(absl::Status status, absl::string_view param);
absl::Status WithErrorCode(absl::Status status, absl::string_view code);

std::string ErrorParam(const absl::Status& status);  // "" when none
std::string ErrorCode(const absl::Status& status);   // "" when none

struct HttpError {
  int http_status = 500;
  nlohmann::json body;  // {"error": {"message", "type", "param", "code"}}
};

// The OpenAI error body and HTTP status for a non-OK status.
HttpError ToHttpError(const absl::Status& status);

}  // namespace moeshard::router
