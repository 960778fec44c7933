#include "worker/gpu/step_profile.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace moeshard::gpu {

StepProfiler::~StepProfiler() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void StepProfiler::Enable(int max_regions) {
  if (events_.empty()) {
    events_.resize(2 * max_regions);
    for (auto& e : events_) cudaEventCreate(&e);
  }
  active_ = true;
}

StepProfiler::Scope::Scope(StepProfiler* p, const char* category, cudaStream_t s) : p_(p), s_(s) {
  if (!p_->enabled() || 2 * (p_->pending_.size() + 1) > p_->events_.size()) return;
  idx_ = static_cast<int>(p_->pending_.size());
  p_->pending_.push_back(category);
  cudaEventRecord(p_->events_[2 * idx_], s_);
}

StepProfiler::Scope::~Scope() {
  if (idx_ >= 0) cudaEventRecord(p_->events_[2 * idx_ + 1], s_);
}

void StepProfiler::Collect() {
  if (!enabled()) return;
  for (size_t i = 0; i < pending_.size(); ++i) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, events_[2 * i], events_[2 * i + 1]) == cudaSuccess) total_ms_[pending_[i]] += ms;
  }
  cudaGetLastError();
  pending_.clear();
  ++steps_;
}

void StepProfiler::Reset() {
  pending_.clear();
  total_ms_.clear();
  steps_ = 0;
}

std::string StepProfiler::Report() const {
  std::vector<std::pair<double, std::string>> rows;
  double sum = 0;
  for (const auto& [k, v] : total_ms_) {
    rows.push_back({v, k});
    sum += v;
  }
  std::sort(rows.rbegin(), rows.rend());
  std::string out;
  for (const auto& [v, k] : rows) {
    out += absl::StrFormat("%s %.3f ms/step (%.0f%%); ", k, v / std::max(1, steps_), 100 * v / std::max(sum, 1e-9));
  }
  return out;
}

}  // namespace moeshard::gpu
