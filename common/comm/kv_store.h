// The key-value store that bootstraps a communicator group: each rank publishes its
// address under a key and waits for the others' (c10d's Store, gloo's rendezvous store).
// The coordinator serves one over gRPC; InMemoryKvStore serves ranks that are threads of
// one process (tests). Keys are write-once in practice, but Set overwrites.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moeshard {

// Implementations are thread-safe: several ranks (threads) call Set and Get at once.
class KvStore {
 public:
  virtual ~KvStore();
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` exists and returns its value; DeadlineExceeded after `timeout`.
  virtual absl::StatusOr<std::string> Get(const std::string& key,
                                          std::chrono::milliseconds timeout) = 0;
};

// A map guarded by a mutex; Get waits on a condition variable. Thread-safe. Bounded: keys
// of at most kMaxKeyBytes, values of at most kMaxValueBytes, at most kMaxKeys keys and
// kMaxTotalBytes in all (a communicator group publishes a few short addresses and ids per
// rank); a Set past a bound is refused with ResourceExhausted and changes nothing.
class InMemoryKvStore : public KvStore {
 public:
  static constexpr size_t kMaxKeyBytes = 512;
  static constexpr size_t kMaxValueBytes = 64 << 10;
  static constexpr size_t kMaxKeys = 1 << 16;
  static constexpr size_t kMaxTotalBytes = 64 << 20;

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  std::chrono::milliseconds timeout) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
  size_t total_bytes_ = 0;
};

}  // namespace moeshard
