#include "router/http_server.h"

#include <chrono>
#include <ctime>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "router/api_error.h"
#include "router/auth.h"
#include "router/log.h"
#include "router/openai_handlers.h"
#include "router/openai_response.h"

namespace moeshard::router {
namespace {

using Json = nlohmann::json;
constexpr char kRequestIdHeader[] = "X-Request-Id";

// Probes and scrapes: counted, but logged only when /metrics fails (/ready answers 503 by design).
bool Quiet(const std::string& path, int status) {
  return path == "/health" || path == "/ready" || (path == "/metrics" && status < 400);
}

Json ReadyJson(const std::vector<PoolState>& pools, bool ready) {
  Json j = {{"ready", ready}, {"pools", Json::array()}};
  for (const PoolState& p : pools) {
    Json coords = Json::array();
    for (const CoordinatorState& c : p.coordinators) {
      coords.push_back({{"address", c.address},
                        {"ready", c.ready},
                        {"outstanding_tokens", c.outstanding_tokens},
                        {"in_flight_tokens", c.in_flight_tokens},
                        {"queue_full", c.queue_full},
                        {"max_model_len", c.max_model_len},
                        {"error", c.error}});
    }
    j["pools"].push_back(
        {{"name", p.name}, {"max_model_len", p.max_model_len}, {"ready", p.ready}, {"coordinators", coords}});
  }
  return j;
}

}  // namespace

std::string RequestIdFor(std::string_view client_id) {
  bool sane = !client_id.empty() && client_id.size() <= 128;
  for (char c : client_id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' || c == '-')) sane = false;
  }
  if (sane) return std::string(client_id);
  thread_local std::mt19937_64 rng(std::random_device{}() ^
                                   static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  return absl::StrFormat("%016x%016x", rng(), rng());
}

std::string EndpointLabel(std::string_view path) {
  for (const char* known : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/ready", "/metrics"}) {
    if (path == known) return known;
  }
  return "other";
}

HttpServer::HttpServer(const RouterServices& services, HttpOptions options)
    : services_(services), options_(std::move(options)) {}

HttpServer::~HttpServer() { Stop(); }

HttpServer::Handler HttpServer::Guarded(Handler handler) const {
  return [this, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    if (BearerAuthorized(req.get_header_value("Authorization"), options_.api_key)) return handler(req, res);
    services_.metrics->RequestRejected(kNoPool, "unauthorized");
    res.set_header("WWW-Authenticate", "Bearer");
    SendError(res, absl::UnauthenticatedError(
                       "Incorrect or missing API key: send the header 'Authorization: Bearer <key>'."));
  };
}

void HttpServer::AddRoutes() {
  httplib::Server& s = *server_;
  const RouterServices& svc = services_;
  s.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    res.set_header(kRequestIdHeader, RequestIdFor(req.get_header_value(kRequestIdHeader)));
    // A connection past the limits, or on a spare thread: the probes only.
    if (RefuseOutsideProbes(req, res)) return httplib::Server::HandlerResponse::Handled;
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    services_.metrics->HttpRequest(EndpointLabel(req.path), res.status);
    if (Quiet(req.path, res.status)) return;
    LogLine(res.get_header_value(kRequestIdHeader),
            absl::StrCat(req.method, " ", req.path, " -> ", res.status, " (", req.remote_addr, ")"));
  });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const int code = res.status;
    SendError(res, code == 404
                       ? absl::NotFoundError(absl::StrCat("no route for ", req.method, " ", req.path))
                       : absl::InvalidArgumentError(absl::StrCat("HTTP ", code, " for ", req.method, " ", req.path)));
    res.status = code;
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    SendError(res, absl::InternalError(absl::StrCat("internal error: ", what)));
  });

  s.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
  // With an API key, the pools, addresses and errors of /ready are for key holders; others
  // get the bare status.
  s.Get("/ready", [this, &svc](const httplib::Request& req, httplib::Response& res) {
    const bool ready = svc.cluster->AnyReady() && !svc.shutting_down->load();
    res.status = ready ? 200 : 503;
    if (!ready) res.set_header("Retry-After", "1");
    const bool detailed = BearerAuthorized(req.get_header_value("Authorization"), options_.api_key);
    res.set_content(DumpJson(detailed ? ReadyJson(svc.cluster->Snapshot(), ready) : Json{{"ready", ready}}),
                    "application/json");
  });
  s.Get("/metrics", Guarded([&svc](const httplib::Request&, httplib::Response& res) {
          svc.metrics->UpdateCoordinators(svc.cluster->Snapshot());
          res.set_content(svc.metrics->Render(), "text/plain; version=0.0.4; charset=utf-8");
        }));
  // The API key is checked inside the handlers, once httplib has read the body: answering
  // before that (in a pre-routing handler) would leave the body to be read as the next
  // request on a keep-alive connection.
  s.Get("/v1/models", Guarded([&svc](const httplib::Request&, httplib::Response& res) {
          Json model = {{"id", svc.served_model_name},
                        {"object", "model"},
                        {"created", static_cast<int64_t>(std::time(nullptr))},
                        {"owned_by", "moeshard"},
                        {"root", svc.served_model_name},
                        {"parent", nullptr},
                        {"max_model_len", svc.cluster->MaxModelLen()}};
          res.set_content(DumpJson(Json{{"object", "list"}, {"data", Json::array({model})}}), "application/json");
        }));
  s.Post("/v1/completions", Guarded([&svc](const httplib::Request& req, httplib::Response& res) {
           HandleCompletions(svc, res.get_header_value(kRequestIdHeader), req, res);
         }));
  s.Post("/v1/chat/completions", Guarded([&svc](const httplib::Request& req, httplib::Response& res) {
           HandleChatCompletions(svc, res.get_header_value(kRequestIdHeader), req, res);
         }));
}

absl::StatusOr<int> HttpServer::Start() {
  auto server = MakeHardenedServer(options_.limits);
  if (!server.ok()) return server.status();
  server_ = *std::move(server);
  server_->set_payload_max_length(options_.max_body_bytes);
  server_->set_read_timeout(30);
  server_->set_write_timeout(30);
  server_->set_tcp_nodelay(true);  // one small write per token: send it now
  AddRoutes();
  absl::StatusOr<int> bound = BindHardenedServer(*server_, options_.host, options_.port);
  if (!bound.ok()) return absl::Status(bound.status().code(), absl::StrCat("http: ", bound.status().message()));
  const int port = *bound;
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // stop() only works once the accept loop runs.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server_->is_running()) {
    if (std::chrono::steady_clock::now() > deadline) return absl::InternalError("http: the server did not start");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return port;
}

void HttpServer::Stop() {
  if (!thread_.joinable()) return;  // never started
  server_->stop();
  thread_.join();
}

}  // namespace moeshard::router
