// The router's HTTP server (cpp-httplib): the OpenAI API under /v1 and the operational
// endpoints /health, /ready and /metrics.
//
// Every request gets an id before routing: the client's X-Request-Id when it is sane,
// otherwise a fresh one. It is returned in the X-Request-Id response header, tags every
// log line of the request and travels to the coordinator. With an API key set, /v1/*
// needs `Authorization: Bearer KEY` (compared in constant time); the operational
// endpoints stay open.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "router/generation.h"

#include "common/http/hardened_server.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace moeshard::router {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 0;           // 0 = any free port
  std::string api_key;    // empty = no authentication; set: /metrics and the detailed /ready need it too
  // Threads (a stream holds one), connection limits, read deadlines and TLS.
  ConnectionLimits limits;
  size_t max_body_bytes = 64u << 20;  // larger request bodies get 413 before they are read
};

class HttpServer {
 public:
  // `services` must outlive the server.
  HttpServer(const RouterServices& services, HttpOptions options);
  ~HttpServer();

  // Binds and starts serving in a thread; returns the bound port.
  absl::StatusOr<int> Start();
  // Stops accepting and waits for the running handlers (cancel generations first).
  void Stop();

 private:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  void AddRoutes();
  // `handler` behind the API key check.
  Handler Guarded(Handler handler) const;

  const RouterServices& services_;
  const HttpOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

// The client's id when it is 1-128 characters of [A-Za-z0-9._:-], else a new random id.
std::string RequestIdFor(std::string_view client_id);
// The label of `path` in <prefix>router_http_requests_total (unknown paths: "other").
std::string EndpointLabel(std::string_view path);

}  // namespace moeshard::router
