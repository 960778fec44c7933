#include "common/comm/kv_store.h"

#include "absl/strings/str_cat.h"

namespace moeshard {

KvStore::~KvStore() = default;

absl::Status InMemoryKvStore::Set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryKvStore::Get(const std::string& key,
                                                 std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = values_.end();
  bool found = cv_.wait_for(lock, timeout, [&] {
    it = values_.find(key);
    return it != values_.end();
  });
  if (!found) {
    return absl::DeadlineExceededError(
        absl::StrCat("kv store: key '", key, "' did not appear within ", timeout.count(), " ms"));
  }
  return it->second;
}

}  // namespace moeshard
