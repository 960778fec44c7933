// The deadline of one engine step, derived from measured step times, so that a hung worker
// (a stopped process, a stuck GPU, a livelocked collective) is noticed in seconds rather than
// at the communicator's timeout.
//
// A step's time grows with its tokens (prefill chunks) but never falls below a fixed cost
// (a decode step). From the last `window` steps the predicted time of a step of n tokens is
//   max over observed steps i of  seconds_i * max(1, n / tokens_i)
// (linear from each observation, never less than any observed step), and the deadline is
//   clamp(factor * predicted, floor, ceiling).
// Before the first observation the deadline is the ceiling (a cold start pages weights in).
//
// Pure, not thread-safe: the engine calls it under its lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>

#include "absl/status/status.h"

namespace moeshard {

struct StepDeadlineConfig {
  std::chrono::milliseconds floor{2000};
  std::chrono::milliseconds ceiling{300000};
  double factor = 8.0;
  size_t window = 64;

  absl::Status Validate() const;
};

class StepDeadline {
 public:
  explicit StepDeadline(StepDeadlineConfig config) : config_(config) {}

  std::chrono::milliseconds For(int64_t num_tokens) const;
  void Observe(int64_t num_tokens, std::chrono::duration<double> took);
  size_t num_observed() const { return observed_.size(); }
  std::chrono::milliseconds ceiling() const { return config_.ceiling; }

 private:
  struct Observation {
    int64_t num_tokens;
    double seconds;
  };
  StepDeadlineConfig config_;
  std::deque<Observation> observed_;
};

}  // namespace moeshard
