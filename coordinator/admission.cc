#include "coordinator/admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace moeshard {

absl::Status AdmissionConfig::Validate() const {
  if (max_queued_requests < 1) return absl::InvalidArgumentError("--max-queued-requests must be >= 1");
  if (max_queued_tokens < 1) return absl::InvalidArgumentError("--max-queued-tokens must be >= 1");
  if (max_queue_time.count() < 1) return absl::InvalidArgumentError("--max-queue-time-s must be > 0");
  if (rate_window.count() < 1) return absl::InvalidArgumentError("the rate window must be > 0");
  return absl::OkStatus();
}

const char* RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kNone:
      return "none";
    case RejectReason::kQueueFull:
      return "queue_full";
    case RejectReason::kQueueTokens:
      return "queue_tokens";
    case RejectReason::kQueueTime:
      return "queue_time";
  }
  return "unknown";
}

void AdmissionControl::Expire(Clock::time_point now) {
  while (!dequeued_.empty() && now - dequeued_.front() > config_.rate_window) dequeued_.pop_front();
}

void AdmissionControl::OnDequeued(Clock::time_point now) {
  Expire(now);
  dequeued_.push_back(now);
}

double AdmissionControl::DequeueRate(Clock::time_point now) {
  Expire(now);
  if (dequeued_.empty()) return 0;
  return static_cast<double>(dequeued_.size()) / std::chrono::duration<double>(config_.rate_window).count();
}

bool AdmissionControl::HasRoom(int64_t queued_requests, int64_t queued_tokens) const {
  const int64_t average = queued_requests > 0 ? queued_tokens / queued_requests : 1;
  return queued_requests + 1 <= config_.max_queued_requests && queued_tokens + average <= config_.max_queued_tokens;
}

AdmissionDecision AdmissionControl::Admit(int64_t queued_requests, int64_t queued_tokens, int64_t prompt_tokens,
                                          Clock::time_point now) {
  AdmissionDecision d;
  const double rate = DequeueRate(now);
  // The time the queue ahead of this request takes to drain, at the measured rate.
  const double wait_s = rate > 0 ? static_cast<double>(queued_requests) / rate : 0;
  const double limit_s = std::chrono::duration<double>(config_.max_queue_time).count();
  if (queued_requests + 1 > config_.max_queued_requests) {
    d.reason = RejectReason::kQueueFull;
    d.message = absl::StrCat("the queue holds ", queued_requests,
                             " requests, the most this coordinator queues (--max-queued-requests ",
                             config_.max_queued_requests, ")");
  } else if (queued_requests > 0 && queued_tokens + prompt_tokens > config_.max_queued_tokens) {
    d.reason = RejectReason::kQueueTokens;
    d.message = absl::StrCat("the queue holds ", queued_tokens, " prompt tokens; ", prompt_tokens,
                             " more would pass --max-queued-tokens ", config_.max_queued_tokens);
  } else if (wait_s > limit_s) {
    d.reason = RejectReason::kQueueTime;
    d.message =
        absl::StrCat("the expected wait is ", static_cast<int64_t>(wait_s), " s (", queued_requests, " queued, ", rate,
                     " leave per second), more than --max-queue-time-s ", static_cast<int64_t>(limit_s));
  }
  return d;
}

}  // namespace moeshard
