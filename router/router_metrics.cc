#include "router/router_metrics.h"

#include "common/metrics/metrics.h"
#include "router/cluster.h"

namespace moeshard::router {

namespace pm = prometheus;

RouterMetrics::RouterMetrics()
    : registry_(std::make_shared<pm::Registry>()),
      requests_(pm::BuildCounter()
                    .Name(MetricName("router_requests_total"))
                    .Help("Generation requests dispatched to a coordinator, by pool.")
                    .Register(*registry_)),
      rejected_(pm::BuildCounter()
                    .Name(MetricName("router_rejected_total"))
                    .Help("Requests refused by the router, by pool (none before dispatch) and reason.")
                    .Register(*registry_)),
      in_flight_(pm::BuildGauge()
                     .Name(MetricName("router_requests_in_flight"))
                     .Help("Generation requests being served, by pool.")
                     .Register(*registry_)),
      http_requests_(pm::BuildCounter()
                         .Name(MetricName("router_http_requests_total"))
                         .Help("HTTP responses, by endpoint and status code.")
                         .Register(*registry_)),
      finished_(pm::BuildCounter()
                    .Name(MetricName("request_success_total"))
                    .Help("Generation requests finished, by pool and finish reason.")
                    .Register(*registry_)),
      prompt_tokens_(pm::BuildCounter()
                         .Name(MetricName("prompt_tokens_total"))
                         .Help("Prompt tokens of finished requests, by pool.")
                         .Register(*registry_)),
      generation_tokens_(pm::BuildCounter()
                             .Name(MetricName("generation_tokens_total"))
                             .Help("Generated tokens of finished requests, by pool.")
                             .Register(*registry_)),
      e2e_latency_(pm::BuildHistogram()
                       .Name(MetricName("e2e_request_latency_seconds"))
                       .Help("Time from dispatch to the last token, by pool.")
                       .Register(*registry_)),
      ttft_(pm::BuildHistogram()
                .Name(MetricName("time_to_first_token_seconds"))
                .Help("Time from dispatch to the first generated token, by pool.")
                .Register(*registry_)),
      coordinator_ready_(pm::BuildGauge()
                             .Name(MetricName("router_coordinator_ready"))
                             .Help("1 when the coordinator's last status poll said ready.")
                             .Register(*registry_)),
      coordinator_outstanding_(pm::BuildGauge()
                                   .Name(MetricName("router_coordinator_outstanding_tokens"))
                                   .Help("Outstanding tokens the coordinator reported at the last poll.")
                                   .Register(*registry_)),
      pool_ready_(pm::BuildGauge()
                      .Name(MetricName("router_pool_ready"))
                      .Help("1 when the pool has a ready coordinator.")
                      .Register(*registry_)) {}

void RouterMetrics::RequestDispatched(const std::string& pool) { requests_.Add({{"pool", pool}}).Increment(); }

void RouterMetrics::RequestRejected(const std::string& pool, const std::string& reason) {
  rejected_.Add({{"pool", pool}, {"reason", reason}}).Increment();
}

void RouterMetrics::InFlightAdd(const std::string& pool, double delta) {
  in_flight_.Add({{"pool", pool}}).Increment(delta);
}

void RouterMetrics::HttpRequest(const std::string& endpoint, int code) {
  http_requests_.Add({{"endpoint", endpoint}, {"code", std::to_string(code)}}).Increment();
}

void RouterMetrics::RequestFinished(const std::string& pool, const std::string& finish_reason, double e2e_seconds,
                                    int64_t prompt_tokens, int64_t generation_tokens) {
  finished_.Add({{"pool", pool}, {"finished_reason", finish_reason}}).Increment();
  prompt_tokens_.Add({{"pool", pool}}).Increment(static_cast<double>(prompt_tokens));
  generation_tokens_.Add({{"pool", pool}}).Increment(static_cast<double>(generation_tokens));
  e2e_latency_.Add({{"pool", pool}}, LatencyBuckets()).Observe(e2e_seconds);
}

void RouterMetrics::FirstToken(const std::string& pool, double seconds) {
  ttft_.Add({{"pool", pool}}, LatencyBuckets()).Observe(seconds);
}

void RouterMetrics::RegisterPools(const std::vector<PoolState>& pools) {
  for (const PoolState& p : pools) {
    requests_.Add({{"pool", p.name}});
    in_flight_.Add({{"pool", p.name}});
  }
  UpdateCoordinators(pools);
}

void RouterMetrics::UpdateCoordinators(const std::vector<PoolState>& pools) {
  for (const PoolState& p : pools) {
    pool_ready_.Add({{"pool", p.name}}).Set(p.ready ? 1 : 0);
    for (const CoordinatorState& c : p.coordinators) {
      const pm::Labels labels = {{"pool", p.name}, {"coordinator", c.address}};
      coordinator_ready_.Add(labels).Set(c.ready ? 1 : 0);
      coordinator_outstanding_.Add(labels).Set(static_cast<double>(c.outstanding_tokens));
    }
  }
}

std::string RouterMetrics::Render() { return RenderMetrics(*registry_); }

}  // namespace moeshard::router
