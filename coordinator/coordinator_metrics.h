// The coordinator's Prometheus metrics, under vLLM's names and meanings with the
// `moeshard:` prefix, so that dashboards made for vLLM carry over.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "coordinator/block_manager.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace moeshard {

// Per-request timestamps, for the latency histograms.
struct SeqTiming {
  std::chrono::steady_clock::time_point arrival, first_scheduled, first_token, last_token;
  bool scheduled = false, has_token = false;
  int64_t prompt_tokens = 0, generated = 0;
};

class CoordinatorMetrics {
 public:
  CoordinatorMetrics();
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  prometheus::Gauge *running, *waiting, *kv_usage;
  prometheus::Counter *prompt_tokens, *generation_tokens, *preemptions, *prefix_queries, *prefix_hits, *lookahead_chunks;
  prometheus::Family<prometheus::Counter>* success;
  prometheus::Family<prometheus::Counter>* rejected;
  prometheus::Histogram *ttft, *itl, *e2e, *queue_time, *prefill_time, *decode_time, *step_time;
  prometheus::Counter *steps_ok, *steps_failed;
  prometheus::Family<prometheus::Gauge>* kv_blocks;  // {kind="full|sliding", state="used|free|cached"}

  // kv_usage (the full pool, as vLLM's) and kv_blocks, from the block manager.
  void SetKv(const BlockManager& blocks);

  void Finished(const SeqTiming& t, const std::string& reason);
  // A request refused by admission control (admission.h names the reasons).
  void Rejected(const std::string& reason) { rejected->Add({{"reason", reason}}).Increment(); }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
};

}  // namespace moeshard
