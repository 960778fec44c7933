// Admission control of one coordinator: a bounded queue, so that an overloaded replica refuses
// new requests at once (the router answers 503 with Retry-After) instead of letting their time
// to first token grow without limit.
//
// A request is queued from Submit until its first step. Admit() refuses when, with the new
// request, the queue would hold more than max_queued_requests requests or max_queued_tokens
// prompt tokens (an empty queue takes any prompt: the scheduler bounds its size), or when the
// expected wait exceeds max_queue_time: queued requests divided by
// the rate at which requests left the queue over the last `rate_window` (measured, not
// configured). Until requests have left the queue in that window the wait is unknown and only
// the two bounds apply.
//
// Pure: the caller passes the clock. Not thread-safe (the engine calls it under its lock).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>

#include "absl/status/status.h"

namespace moeshard {

struct AdmissionConfig {
  int64_t max_queued_requests = 256;
  int64_t max_queued_tokens = 65536;
  std::chrono::milliseconds max_queue_time{30000};
  std::chrono::milliseconds rate_window{10000};

  absl::Status Validate() const;
};

// Why a request was refused: also the label of the rejection metric.
enum class RejectReason { kNone, kQueueFull, kQueueTokens, kQueueTime };
const char* RejectReasonName(RejectReason reason);

struct AdmissionDecision {
  RejectReason reason = RejectReason::kNone;
  std::string message;
  bool admitted() const { return reason == RejectReason::kNone; }
};

class AdmissionControl {
 public:
  using Clock = std::chrono::steady_clock;
  explicit AdmissionControl(AdmissionConfig config) : config_(config) {}

  // The decision for a request of `prompt_tokens` given what is queued now.
  AdmissionDecision Admit(int64_t queued_requests, int64_t queued_tokens, int64_t prompt_tokens, Clock::time_point now);
  // A queued request had its first step at `now`.
  void OnDequeued(Clock::time_point now);
  // Requests per second that left the queue over the window; 0 when none did.
  double DequeueRate(Clock::time_point now);
  // True when one more request of average size would still be admitted (the router's hint).
  bool HasRoom(int64_t queued_requests, int64_t queued_tokens) const;

  const AdmissionConfig& config() const { return config_; }

 private:
  void Expire(Clock::time_point now);

  AdmissionConfig config_;
  std::deque<Clock::time_point> dequeued_;  // within the window, oldest first
};

}  // namespace moeshard
