#include "coordinator/step_deadline.h"

#include <algorithm>

namespace moeshard {

absl::Status StepDeadlineConfig::Validate() const {
  if (floor.count() < 1 || ceiling < floor) {
    return absl::InvalidArgumentError("--step-deadline-floor-ms must be > 0 and at most the ceiling");
  }
  if (factor < 1.0) return absl::InvalidArgumentError("the step deadline factor must be >= 1");
  if (window < 1) return absl::InvalidArgumentError("the step deadline window must be >= 1");
  return absl::OkStatus();
}

std::chrono::milliseconds StepDeadline::For(int64_t num_tokens) const {
  if (observed_.empty()) return config_.ceiling;
  const double n = static_cast<double>(std::max<int64_t>(1, num_tokens));
  double predicted = 0;
  for (const Observation& o : observed_) {
    predicted =
        std::max(predicted, o.seconds * std::max(1.0, n / static_cast<double>(std::max<int64_t>(1, o.num_tokens))));
  }
  const auto ms = std::chrono::milliseconds(static_cast<int64_t>(config_.factor * predicted * 1000.0));
  return std::clamp(ms, config_.floor, config_.ceiling);
}

void StepDeadline::Observe(int64_t num_tokens, std::chrono::duration<double> took) {
  observed_.push_back({num_tokens, took.count()});
  while (observed_.size() > config_.window) observed_.pop_front();
}

}  // namespace moeshard
