#include "common/metrics/metrics.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/http/hardened_server.h"
#include "common/status.h"
#include "httplib.h"
#include "prometheus/text_serializer.h"

namespace moeshard {
namespace {
// Never destroyed (the /metrics threads may read it while the process exits).
std::string& Prefix() {
  static std::string* prefix = new std::string(kDefaultMetricPrefix);
  return *prefix;
}
}  // namespace

absl::Status ValidateMetricPrefix(const std::string& prefix) {
  if (prefix != "moeshard_" && prefix != "moeshard:") {
    return absl::InvalidArgumentError(absl::StrCat("--metric-prefix must be moeshard_ (the default, promtool-clean) or moeshard: (vLLM's style), got '",
                                                   prefix, "'"));
  }
  return absl::OkStatus();
}

absl::Status SetMetricPrefix(const std::string& prefix) {
  if (absl::Status st = ValidateMetricPrefix(prefix); !st.ok()) return st;
  Prefix() = prefix;
  return absl::OkStatus();
}

const std::string& MetricPrefix() { return Prefix(); }

std::string MetricName(const std::string& base) { return Prefix() + base; }

std::string RenderMetrics(prometheus::Registry& registry) {
  prometheus::TextSerializer s;
  return s.Serialize(registry.Collect());
}

prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
}

MetricsServer::MetricsServer() = default;
MetricsServer::~MetricsServer() { Stop(); }

absl::StatusOr<int> MetricsServer::Start(const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry,
                                         Authorizer authorize) {
  registry_ = std::move(registry);
  // Scrapers and probes are few: a small pool, and slow or surplus connections cannot hold it.
  ConnectionLimits limits;
  limits.num_threads = 8;
  limits.num_probe_threads = 2;
  limits.max_connections = 32;
  limits.max_per_client = 6;
  limits.request_read_timeout_s = 5;
  limits.probe_paths = {"/health", "/metrics"};
  ASSIGN_OR_RETURN(server_, MakeHardenedServer(limits));
  server_->set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    return RefuseOutsideProbes(req, res) ? httplib::Server::HandlerResponse::Handled : httplib::Server::HandlerResponse::Unhandled;
  });
  server_->Get("/metrics", [this, authorize = std::move(authorize)](const httplib::Request& req, httplib::Response& res) {
    if (authorize && !authorize(req.get_header_value("Authorization"))) {
      res.status = 401;
      res.set_header("WWW-Authenticate", "Bearer");
      res.set_content("/metrics needs the cluster credential: Authorization: Bearer <token>\n", "text/plain");
      return;
    }
    res.set_content(RenderMetrics(*registry_), "text/plain; version=0.0.4; charset=utf-8");
  });
  server_->Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
  absl::StatusOr<int> bound_or = BindHardenedServer(*server_, host, port);
  if (!bound_or.ok()) {
    return absl::Status(bound_or.status().code(), absl::StrCat("metrics: ", bound_or.status().message()));
  }
  const int bound = *bound_or;
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // httplib's stop() does nothing before the accept loop runs: a process that fails right after
  // Start (a refused flag, say) and stops its metrics server would otherwise wait on it forever.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server_->is_running()) {
    if (std::chrono::steady_clock::now() > deadline) return absl::InternalError("metrics: the server did not start");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return bound;
}

void MetricsServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace moeshard
