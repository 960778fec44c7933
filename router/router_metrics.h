// The router's Prometheus metrics. Names follow vLLM's `vllm:` convention with the
// `moeshard:` prefix; counters end in _total, every family has HELP text.
// Thread-safe (prometheus-cpp families lock on Add, metrics are atomic).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace moeshard::router {

struct PoolState;

// The `pool` label of requests rejected before a pool was chosen.
inline constexpr char kNoPool[] = "none";

class RouterMetrics {
 public:
  RouterMetrics();

  void RequestDispatched(const std::string& pool);
  // reason: bad_request, unauthorized, model_not_found, context_length, no_ready_pool,
  // coordinator_error, shutting_down.
  void RequestRejected(const std::string& pool, const std::string& reason);
  void InFlightAdd(const std::string& pool, double delta);
  void HttpRequest(const std::string& endpoint, int code);
  void RequestFinished(const std::string& pool, const std::string& finish_reason, double e2e_seconds,
                       int64_t prompt_tokens, int64_t generation_tokens);
  void FirstToken(const std::string& pool, double seconds);
  // Creates each pool's series at zero, so that they exist before the first request.
  void RegisterPools(const std::vector<PoolState>& pools);
  // The coordinators' state, refreshed before each scrape.
  void UpdateCoordinators(const std::vector<PoolState>& pools);

  std::string Render();

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& rejected_;
  prometheus::Family<prometheus::Gauge>& in_flight_;
  prometheus::Family<prometheus::Counter>& http_requests_;
  prometheus::Family<prometheus::Counter>& finished_;
  prometheus::Family<prometheus::Counter>& prompt_tokens_;
  prometheus::Family<prometheus::Counter>& generation_tokens_;
  prometheus::Family<prometheus::Histogram>& e2e_latency_;
  prometheus::Family<prometheus::Histogram>& ttft_;
  prometheus::Family<prometheus::Gauge>& coordinator_ready_;
  prometheus::Family<prometheus::Gauge>& coordinator_outstanding_;
  prometheus::Family<prometheus::Gauge>& pool_ready_;
};

}  // namespace moeshard::router
