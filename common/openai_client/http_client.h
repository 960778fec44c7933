// A small HTTP client for the OpenAI-compatible API of a moeshard router (or any
// server that speaks it), over cpp-httplib: JSON requests, server-sent-event streams
// that the caller can abandon mid-way (the connection is closed, as a client that goes
// away would), and a bearer key. Thread-safe: every call opens its own connection.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace moeshard::openai_client {

// Keys keep their order: top_logprobs maps are checked for their order.
using Json = nlohmann::ordered_json;

struct HttpResponse {
  int status = 0;  // 0: no response (transport error in `error`)
  std::string body;
  std::string error;
  std::string content_type, retry_after;
  // The body as JSON, or an error naming the status and the first bytes of the body.
  absl::StatusOr<Json> JsonBody() const;
  std::string Describe() const;  // "HTTP 400: {...}" (body cut at 300 bytes)
};

// Which Authorization header a request carries.
enum class Auth { kDefault, kNone, kWrongKey };

class HttpClient {
 public:
  // `url`: http://host:port (a path prefix is not supported). `api_key` may be empty.
  HttpClient(std::string url, std::string api_key, double timeout_s = 120);
  const std::string& url() const { return url_; }
  const std::string& api_key() const { return api_key_; }

  HttpResponse Get(const std::string& path, Auth auth = Auth::kDefault) const;
  HttpResponse Post(const std::string& path, const std::string& body, Auth auth = Auth::kDefault) const;
  HttpResponse PostJson(const std::string& path, const Json& body, Auth auth = Auth::kDefault) const {
    return Post(path, body.dump(), auth);
  }

  // POST that reads the response as server-sent events: `on_data` sees each event's data
  // (e.g. a JSON chunk or "[DONE]") as it arrives; returning false closes the connection.
  // A non-2xx response is returned whole in `body` without calling `on_data`.
  HttpResponse PostStream(const std::string& path, const Json& body,
                          const std::function<bool(const std::string& data)>& on_data) const;

 private:
  std::string url_, api_key_;
  double timeout_s_;
};

// Splits an SSE byte stream into events' data fields. Feed bytes as they come.
class SseParser {
 public:
  // Calls `on_data` for each complete event; stops (returns false) when it returns false.
  bool Feed(const char* data, size_t n, const std::function<bool(const std::string&)>& on_data);
  // Bytes left over that never formed an event (should be empty after a clean stream).
  const std::string& pending() const { return buf_; }

 private:
  std::string buf_;
};

}  // namespace moeshard::openai_client
