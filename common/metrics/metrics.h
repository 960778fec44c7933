// Prometheus metrics of a process: one registry, rendered in the text exposition format
// and served at /metrics, either by the process's own HTTP server (the router) or by a
// small server of its own (coordinator, worker).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace httplib {
class Server;
}

namespace moeshard {

// Metric names. Every metric is exported as prefix + base name, with vLLM's base names and
// meanings (num_requests_running, time_to_first_token_seconds, ...). The default prefix
// "moeshard_" is what `promtool check metrics` accepts: a colon is reserved for recording
// rules. deploy/prometheus/recording_rules.yml records each series again as
// "moeshard:<base>" (vLLM's "vllm:<base>" style), which the dashboards query, so dashboards
// written for vLLM carry over by swapping the prefix. "moeshard:" exports that style
// directly (--metric-prefix moeshard:), for a Prometheus without the recording rules.
inline constexpr const char* kDefaultMetricPrefix = "moeshard_";
// Sets the prefix for metrics registered from now on: "moeshard_" or "moeshard:"; any
// other value is an InvalidArgument naming the accepted ones. Call before any metric exists.
absl::Status SetMetricPrefix(const std::string& prefix);
// Checks a --metric-prefix value without setting it (the same error as SetMetricPrefix).
absl::Status ValidateMetricPrefix(const std::string& prefix);
const std::string& MetricPrefix();
std::string MetricName(const std::string& base);

std::string RenderMetrics(prometheus::Registry& registry);

// Histogram buckets for latencies in seconds, from 1 ms to 5 min.
prometheus::Histogram::BucketBoundaries LatencyBuckets();

// Serves GET /metrics (and GET /health, which answers "ok") on host:port in a thread.
class MetricsServer {
 public:
  // Whether a request's Authorization header may read /metrics.
  using Authorizer = std::function<bool(std::string_view authorization)>;

  MetricsServer();
  ~MetricsServer();
  // port 0 picks a free port; returns the port bound. With `authorize`, /metrics answers 401
  // (WWW-Authenticate: Bearer) to a request it refuses; /health stays open.
  absl::StatusOr<int> Start(const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry,
                            Authorizer authorize = nullptr);
  void Stop();

 private:
  std::unique_ptr<httplib::Server> server_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::thread thread_;
};

}  // namespace moeshard
