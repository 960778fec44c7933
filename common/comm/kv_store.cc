#include "common/comm/kv_store.h"

#include "absl/strings/str_cat.h"

namespace moeshard {

KvStore::~KvStore() = default;

absl::Status InMemoryKvStore::Set(const std::string& key, const std::string& value) {
  if (key.empty() || key.size() > kMaxKeyBytes || value.size() > kMaxValueBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("kv store: keys take 1-", kMaxKeyBytes, " bytes and values at most ", kMaxValueBytes));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    const size_t old_bytes = it == values_.end() ? 0 : key.size() + it->second.size();
    if (it == values_.end() && values_.size() >= kMaxKeys) {
      return absl::ResourceExhaustedError(absl::StrCat("kv store: full (", kMaxKeys, " keys)"));
    }
    if (total_bytes_ - old_bytes + key.size() + value.size() > kMaxTotalBytes) {
      return absl::ResourceExhaustedError(absl::StrCat("kv store: full (", kMaxTotalBytes, " bytes)"));
    }
    total_bytes_ = total_bytes_ - old_bytes + key.size() + value.size();
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
