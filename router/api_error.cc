#include "router/api_error.h"

#include "absl/strings/cord.h"
#include "proto/status_convert.h"

namespace moeshard::router {
namespace {

constexpr char kParamUrl[] = "moeshard.dev/error/param";
constexpr char kCodeUrl[] = "moeshard.dev/error/code";

std::string Payload(const absl::Status& status, const char* url) {
  auto p = status.GetPayload(url);
  return p ? std::string(*p) : std::string();
}

absl::Status WithPayload(absl::Status status, const char* url, absl::string_view value) {
  if (status.ok() || value.empty() || status.GetPayload(url)) return status;
  status.SetPayload(url, absl::Cord(value));
  return status;
}

}  // namespace

absl::Status InvalidParam(absl::string_view param, absl::string_view message, absl::string_view code) {
  return WithErrorCode(WithParam(absl::InvalidArgumentError(message), param), code);
}

absl::Status WithParam(absl::Status status, absl::string_view param) {
  return WithPayload(std::move(status), kParamUrl, param);
}

absl::Status WithErrorCode(absl::Status status, absl::string_view code) {
  return WithPayload(std::move(status), kCodeUrl, code);
}

std::string ErrorParam(const absl::Status& status) { return Payload(status, kParamUrl); }
std::string ErrorCode(const absl::Status& status) { return Payload(status, kCodeUrl); }

HttpError ToHttpError(const absl::Status& status) {
  HttpError e;
  e.http_status = HttpStatusCode(status.code());
  std::string code = ErrorCode(status);
  // OpenAI's error type follows the HTTP status.
  std::string type = "server_error";
  switch (e.http_status) {
    case 400:
    case 403:
    case 404: type = "invalid_request_error"; break;
    case 401:
      type = "invalid_request_error";
      if (code.empty()) code = "invalid_api_key";
      break;
    case 429: type = "rate_limit_error"; break;
    case 503:
      type = "service_unavailable_error";
      if (code.empty()) code = "service_unavailable";
      break;
    default: break;
  }
  const std::string param = ErrorParam(status);
  nlohmann::json err = {{"message", std::string(status.message())}, {"type", type}};
  err["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
  err["code"] = code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code);
  e.body = {{"error", std::move(err)}};
  return e;
}

}  // namespace moeshard::router
