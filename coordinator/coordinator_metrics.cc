#include "coordinator/coordinator_metrics.h"

#include "common/metrics/metrics.h"

namespace moeshard {
namespace {
double Seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

CoordinatorMetrics::CoordinatorMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  auto gauge = [&](const std::string& name, const char* help) { return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({}); };
  auto counter = [&](const std::string& name, const char* help) { return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({}); };
  auto hist = [&](const std::string& name, const char* help) {
    return &prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, LatencyBuckets());
  };
  running = gauge(MetricName("num_requests_running"), "Number of requests in model execution batches");
  waiting = gauge(MetricName("num_requests_waiting"), "Number of requests waiting to be processed");
  kv_usage = gauge(MetricName("kv_cache_usage_perc"), "KV-cache usage: 1 means 100 percent of blocks in use");
  prompt_tokens = counter(MetricName("prompt_tokens_total"), "Number of prefill tokens processed");
  generation_tokens = counter(MetricName("generation_tokens_total"), "Number of generation tokens processed");
  preemptions = counter(MetricName("num_preemptions_total"), "Cumulative number of preemptions (recomputed later)");
  prefix_queries = counter(MetricName("prefix_cache_queries_total"), "Prefix cache queries, in prompt tokens");
  prefix_hits = counter(MetricName("prefix_cache_hits_total"), "Prefix cache hits, in prompt tokens");
  lookahead_chunks = counter(MetricName("lookahead_chunks_total"),
                             "Decode chunks sent before their token was drawn (lookahead: one worker with the whole model)");
  success = &prometheus::BuildCounter().Name(MetricName("request_success_total"))
                 .Help("Count of finished requests, by finish reason (stop, length, abort)").Register(r);
  for (const char* reason : {"stop", "length", "abort"}) success->Add({{"finished_reason", reason}});
  rejected = &prometheus::BuildCounter().Name(MetricName("request_rejected_total"))
                  .Help("Requests refused at admission (503 + Retry-After), by reason (queue_full, queue_tokens, queue_time)")
                  .Register(r);
  for (const char* reason : {"queue_full", "queue_tokens", "queue_time"}) rejected->Add({{"reason", reason}});
  ttft = hist(MetricName("time_to_first_token_seconds"), "Time to first token in seconds");
  itl = hist(MetricName("inter_token_latency_seconds"), "Time between consecutive output tokens in seconds");
  e2e = hist(MetricName("e2e_request_latency_seconds"), "End-to-end request latency in seconds");
  queue_time = hist(MetricName("request_queue_time_seconds"), "Time a request waited before its first step, in seconds");
  prefill_time = hist(MetricName("request_prefill_time_seconds"), "Time from the first step to the first token, in seconds");
  decode_time = hist(MetricName("request_decode_time_seconds"), "Time from the first token to the last, in seconds");
  step_time = hist(MetricName("step_seconds"), "Time of one engine step across all workers, in seconds");
  auto& steps = prometheus::BuildCounter().Name(MetricName("steps_total")).Help("Engine steps, by result").Register(r);
  steps_ok = &steps.Add({{"result", "ok"}});
  steps_failed = &steps.Add({{"result", "error"}});
  kv_blocks = &prometheus::BuildGauge().Name(MetricName("kv_blocks"))
                   .Help("KV blocks by pool (full: full-attention layers, or every layer of a one-kind model; sliding: "
                         "sliding-window layers) and state (used by sequences, cached for prefix reuse, free)")
                   .Register(r);
  for (const char* kind : {"full", "sliding"}) {
    for (const char* state : {"used", "free", "cached"}) kv_blocks->Add({{"kind", kind}, {"state", state}});
  }
}

void CoordinatorMetrics::SetKv(const BlockManager& blocks) {
  kv_usage->Set(blocks.Usage());
  for (KvKind kind : {KvKind::kFull, KvKind::kSliding}) {
    const KvPoolStats s = blocks.Stats(kind);
    const std::string k = kind == KvKind::kFull ? "full" : "sliding";
    kv_blocks->Add({{"kind", k}, {"state", "used"}}).Set(static_cast<double>(s.used));
    kv_blocks->Add({{"kind", k}, {"state", "free"}}).Set(static_cast<double>(s.free));
    kv_blocks->Add({{"kind", k}, {"state", "cached"}}).Set(static_cast<double>(s.evictable));
  }
}

void CoordinatorMetrics::Finished(const SeqTiming& t, const std::string& reason) {
  auto now = std::chrono::steady_clock::now();
  success->Add({{"finished_reason", reason}}).Increment();
  e2e->Observe(Seconds(now - t.arrival));
  if (t.scheduled) queue_time->Observe(Seconds(t.first_scheduled - t.arrival));
  if (t.has_token) {
    prefill_time->Observe(Seconds(t.first_token - t.first_scheduled));
    decode_time->Observe(Seconds(t.last_token - t.first_token));
  }
}

}  // namespace moeshard
