#include "router/cluster.h"

#include <algorithm>
#include <utility>

namespace moeshard::router {

// ---------------------------------------------------------------- Lease

Lease::Lease(Lease&& other) noexcept { *this = std::move(other); }

Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Release();
    cluster_ = std::exchange(other.cluster_, nullptr);
    coordinator_idx_ = other.coordinator_idx_;
    pool_ = std::move(other.pool_);
    max_tokens_ = other.max_tokens_;
    held_tokens_ = std::exchange(other.held_tokens_, 0);
  }
  return *this;
}

Lease::~Lease() { Release(); }

CoordinatorClient* Lease::client() const {
  return cluster_ == nullptr ? nullptr : cluster_->entries_[coordinator_idx_].client.get();
}

void Lease::TokensDone(int64_t num_tokens) {
  if (cluster_ == nullptr) return;
  num_tokens = std::min(num_tokens, held_tokens_);
  held_tokens_ -= num_tokens;
  std::lock_guard<std::mutex> lock(cluster_->mu_);
  cluster_->entries_[coordinator_idx_].state.in_flight_tokens -= num_tokens;
}

void Lease::MarkFailed(const std::string& error) {
  if (cluster_ == nullptr) return;
  bool changed = false;
  bool ready = false;
  {
    std::lock_guard<std::mutex> lock(cluster_->mu_);
    CoordinatorState& s = cluster_->entries_[coordinator_idx_].state;
    s.ready = false;
    s.error = error;
    const bool before = cluster_->any_ready_;
    cluster_->UpdateReadiness();
    changed = before != cluster_->any_ready_;
    ready = cluster_->any_ready_;
  }
  if (changed && cluster_->readiness_callback_) cluster_->readiness_callback_(ready);
}

void Lease::Release() {
  if (cluster_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(cluster_->mu_);
    cluster_->entries_[coordinator_idx_].state.in_flight_tokens -= held_tokens_;
  }
  held_tokens_ = 0;
  cluster_ = nullptr;
}

// ---------------------------------------------------------------- Cluster

Cluster::Cluster(std::vector<PoolConfig> pools, absl::Duration poll_interval)
    : pools_(std::move(pools)), poll_interval_(poll_interval) {
  for (size_t p = 0; p < pools_.size(); ++p) {
    for (const std::string& address : pools_[p].coordinators) {
      Entry e;
      e.pool_idx = p;
      e.client = std::make_unique<CoordinatorClient>(address);
      e.state.pool = pools_[p].name;
      e.state.address = address;
      e.state.error = "not polled yet";
      entries_.push_back(std::move(e));
    }
  }
}

Cluster::~Cluster() { Stop(); }

void Cluster::SetReadinessCallback(std::function<void(bool)> callback) { readiness_callback_ = std::move(callback); }

void Cluster::Start() {
  for (size_t i = 0; i < entries_.size(); ++i) pollers_.emplace_back([this, i] { PollLoop(i); });
}

void Cluster::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  for (std::thread& t : pollers_) t.join();
  pollers_.clear();
}

void Cluster::PollLoop(size_t idx) {
  CoordinatorClient* client = entries_[idx].client.get();
  // A poll may take up to the interval but never less than a second to time out: a busy
  // coordinator answers late, which is not the same as a dead one.
  const absl::Duration timeout = std::max(poll_interval_ * 4, absl::Seconds(1));
  while (true) {
    auto reply = client->GetStatus(timeout);
    bool changed = false;
    bool ready = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stopping_) return;
      CoordinatorState& s = entries_[idx].state;
      if (reply.ok()) {
        s.ready = reply->ready();
        s.outstanding_tokens = reply->outstanding_tokens();
        s.max_model_len = reply->max_model_len();
        s.queue_full = reply->queue_full();
        s.model = reply->model();
        s.error = reply->ready() ? "" : (reply->error().empty() ? "coordinator not ready" : reply->error());
      } else {
        s.ready = false;
        s.error = std::string(reply.status().message());
      }
      const bool before = any_ready_;
      UpdateReadiness();
      changed = before != any_ready_;
      ready = any_ready_;
    }
    if (changed && readiness_callback_) readiness_callback_(ready);
    std::unique_lock<std::mutex> lock(mu_);
    if (stop_cv_.wait_for(lock, absl::ToChronoMilliseconds(poll_interval_), [this] { return stopping_; })) return;
  }
}

int64_t Cluster::PoolLen(size_t pool_idx) const {
  if (pools_[pool_idx].max_model_len > 0) return pools_[pool_idx].max_model_len;
  int64_t len = 0;  // single-coordinator mode: what the coordinators report
  for (const Entry& e : entries_) {
    if (e.pool_idx == pool_idx) len = std::max(len, e.state.max_model_len);
  }
  return len;
}

void Cluster::UpdateReadiness() {
  any_ready_ = false;
  for (const Entry& e : entries_) {
    if (e.state.ready && PoolLen(e.pool_idx) > 0) any_ready_ = ever_ready_ = true;
  }
}

bool Cluster::EverReady() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ever_ready_;
}

bool Cluster::AnyReady() const {
  std::lock_guard<std::mutex> lock(mu_);
  return any_ready_;
}

int64_t Cluster::MaxModelLen() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t len = 0;
  for (size_t p = 0; p < pools_.size(); ++p) len = std::max(len, PoolLen(p));
  return len;
}

std::vector<PoolState> Cluster::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<PoolState> out(pools_.size());
  for (size_t p = 0; p < pools_.size(); ++p) {
    out[p].name = pools_[p].name;
    out[p].max_model_len = PoolLen(p);
  }
  for (const Entry& e : entries_) {
    out[e.pool_idx].coordinators.push_back(e.state);
    if (e.state.ready && out[e.pool_idx].max_model_len > 0) out[e.pool_idx].ready = true;
  }
  return out;
}

absl::StatusOr<Lease> Cluster::Acquire(int64_t prompt_tokens, std::optional<int64_t> max_tokens,
                                       const std::vector<std::string>& excluded) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<PoolView> views(pools_.size());
  std::vector<std::vector<size_t>> entry_of(pools_.size());  // view index -> entry index
  for (size_t p = 0; p < pools_.size(); ++p) views[p].max_model_len = PoolLen(p);
  for (size_t i = 0; i < entries_.size(); ++i) {
    const CoordinatorState& s = entries_[i].state;
    const bool skip = std::find(excluded.begin(), excluded.end(), s.address) != excluded.end();
    views[entries_[i].pool_idx].coordinators.push_back(CoordinatorView{
        .ready = s.ready && !skip,
        .load_tokens = s.outstanding_tokens + s.in_flight_tokens,
        .max_model_len = s.max_model_len,
        .queue_full = s.queue_full,
    });
    entry_of[entries_[i].pool_idx].push_back(i);
  }
  auto choice = ChooseDispatch(views, prompt_tokens, max_tokens);
  if (!choice.ok()) return choice.status();
  Lease lease;
  lease.cluster_ = this;
  lease.coordinator_idx_ = entry_of[choice->pool_idx][choice->coordinator_idx];
  lease.pool_ = pools_[choice->pool_idx].name;
  lease.max_tokens_ = choice->max_tokens;
  lease.held_tokens_ = prompt_tokens + choice->max_tokens;
  entries_[lease.coordinator_idx_].state.in_flight_tokens += lease.held_tokens_;
  return lease;
}

}  // namespace moeshard::router
