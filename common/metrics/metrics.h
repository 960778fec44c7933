// Prometheus metrics of a process: one registry, rendered in the text exposition format
// and served at /metrics, either by the process's own HTTP server (the router) or by a
// small server of its own (coordinator, worker).
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace httplib {
class Server;
}

namespace moeshard {

std::string RenderMetrics(prometheus::Registry& registry);

// Histogram buckets for latencies in seconds, from 1 ms to 5 min.
prometheus::Histogram::BucketBoundaries LatencyBuckets();

// Serves GET /metrics (and GET /health, which answers "ok") on host:port in a thread.
class MetricsServer {
 public:
  MetricsServer();
  ~MetricsServer();
  // port 0 picks a free port; returns the port bound.
  absl::StatusOr<int> Start(const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry);
  void Stop();

 private:
  std::unique_ptr<httplib::Server> server_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::thread thread_;
};

}  // namespace moeshard
