// The coordinators behind the router, grouped in pools, with their last known status.
//
// One poller thread per coordinator calls GetStatus every poll interval; a coordinator is
// ready while its last poll succeeded with StatusReply.ready. Acquire() turns a snapshot
// into the dispatch choice (pools.h) and returns a Lease that counts the request's tokens
// as in flight to the chosen coordinator until the lease is released, so that requests
// sent between two polls spread out.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "router/coordinator_client.h"
#include "router/pools.h"

namespace moeshard::router {

// One coordinator's state as the router knows it (also shown by GET /ready).
struct CoordinatorState {
  std::string pool;
  std::string address;
  bool ready = false;
  int64_t outstanding_tokens = 0;  // as reported
  int64_t in_flight_tokens = 0;    // this router's leases
  int64_t max_model_len = 0;       // as reported
  bool queue_full = false;         // as reported
  std::string model;
  std::string error;  // last poll error or the coordinator's own
};

struct PoolState {
  std::string name;
  int64_t max_model_len = 0;
  bool ready = false;
  std::vector<CoordinatorState> coordinators;
};

class Cluster;

// A request's claim on a coordinator. Move-only; releasing (or destroying) it returns the
// tokens it still holds. Thread-compatible.
class Lease {
 public:
  Lease() = default;
  Lease(Lease&& other) noexcept;
  Lease& operator=(Lease&& other) noexcept;
  ~Lease();

  CoordinatorClient* client() const;
  const std::string& pool() const { return pool_; }
  int64_t max_tokens() const { return max_tokens_; }
  // Generated tokens leave the in-flight count as they arrive.
  void TokensDone(int64_t num_tokens);
  // The coordinator failed the call: mark it not ready until its next good poll.
  void MarkFailed(const std::string& error);
  void Release();

 private:
  friend class Cluster;
  Cluster* cluster_ = nullptr;
  size_t coordinator_idx_ = 0;
  std::string pool_;
  int64_t max_tokens_ = 0;
  int64_t held_tokens_ = 0;
};

class Cluster {
 public:
  // `pools` from ParsePoolsConfig, or one pool with max_model_len 0 whose length comes
  // from its coordinators' status. Nothing runs before Start().
  Cluster(std::vector<PoolConfig> pools, absl::Duration poll_interval);
  ~Cluster();

  // Called (from a poller thread) whenever AnyReady() changes.
  void SetReadinessCallback(std::function<void(bool)> callback);
  void Start();
  void Stop();

  // The dispatch choice; `excluded` names coordinators (by address) to avoid, e.g. one
  // that just failed this request.
  absl::StatusOr<Lease> Acquire(int64_t prompt_tokens, std::optional<int64_t> max_tokens,
                                const std::vector<std::string>& excluded = {});

  bool AnyReady() const;
  // Whether a pool was ready at some point: a cluster that is healing, not one still starting.
  bool EverReady() const;
  std::vector<PoolState> Snapshot() const;
  // The largest context length known (configured or reported), 0 when none yet.
  int64_t MaxModelLen() const;

 private:
  friend class Lease;
  struct Entry {
    size_t pool_idx = 0;
    std::unique_ptr<CoordinatorClient> client;
    CoordinatorState state;
  };

  void PollLoop(size_t idx);
  void UpdateReadiness();                  // requires mu_
  int64_t PoolLen(size_t pool_idx) const;  // requires mu_

  const std::vector<PoolConfig> pools_;
  const absl::Duration poll_interval_;
  mutable std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  bool any_ready_ = false;
  bool ever_ready_ = false;
  std::vector<Entry> entries_;
  std::vector<std::thread> pollers_;
  std::function<void(bool)> readiness_callback_;
};

}  // namespace moeshard::router
