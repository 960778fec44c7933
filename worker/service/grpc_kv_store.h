// The coordinator's key-value store seen from a worker: KvStore over the Coordinator
// service's StoreSet/StoreGet RPCs. Bootstraps the workers' communicators.
#pragma once

#include <memory>
#include <string>

#include "common/comm/kv_store.h"
#include "proto/moeshard.grpc.pb.h"

namespace moeshard {

class GrpcKvStore : public KvStore {
 public:
  explicit GrpcKvStore(const std::string& address);
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override;

 private:
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

}  // namespace moeshard
