// Internal to moeshard_comm_gloo (includes Gloo): Gloo's rendezvous store over a KvStore.
#pragma once

#include <gloo/common/error.h>
#include <gloo/rendezvous/store.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/comm/kv_store.h"

namespace moeshard::internal {

using Clock = std::chrono::steady_clock;

// Time left until `deadline`, rounded up so that a wait never ends before it.
inline std::chrono::milliseconds TimeLeft(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(0),
                  std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()));
}

// gloo::rendezvous::Store over a KvStore, with every key under `prefix/`. Gloo expects
// failures as exceptions: the adapter throws, and keeps the status for the caller to
// return. All waits share one deadline, so the whole rendezvous takes at most `timeout`.
// Used by one thread, during CreateGlooCommunicator only.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(KvStore* store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), deadline_(Clock::now() + timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_->Set(Key(key), std::string(data.begin(), data.end())));
  }
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> value = store_->Get(Key(key), TimeLeft(deadline_));
    Check(value.status());
    return std::vector<char>(value->begin(), value->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, TimeLeft(deadline_)); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    Clock::time_point deadline = std::min(deadline_, Clock::now() + timeout);
    for (const std::string& key : keys) Check(store_->Get(Key(key), TimeLeft(deadline)).status());
  }

  const absl::Status& status() const { return status_; }

 private:
  std::string Key(const std::string& key) const { return absl::StrCat(prefix_, "/", key); }
  void Check(const absl::Status& status) {
    if (status.ok()) return;
    status_ = status;
    throw gloo::IoException(std::string(status.message()));
  }

  KvStore* store_;
  std::string prefix_;
  Clock::time_point deadline_;
  absl::Status status_;
};

}  // namespace moeshard::internal
