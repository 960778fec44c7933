// The router's connection to one coordinator (moeshard.v1.Coordinator): status polls and
// streaming Generate calls over one gRPC channel.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/moeshard.grpc.pb.h"

namespace moeshard::router {

// Thread-safe; the channel connects lazily and reconnects by itself.
class CoordinatorClient {
 public:
  explicit CoordinatorClient(std::string address);

  const std::string& address() const { return address_; }
  absl::StatusOr<v1::StatusReply> GetStatus(absl::Duration timeout);
  v1::Coordinator::Stub* stub() { return stub_.get(); }

 private:
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

// One streaming Generate call. Read() and Finish() belong to one thread; Cancel() may be
// called from any thread, any number of times, and makes a blocked Read() return false.
class GenerateCall {
 public:
  GenerateCall(CoordinatorClient* client, const v1::SeqRequest& request);
  ~GenerateCall();

  bool Read(v1::SeqUpdate* update);
  void Cancel();
  bool cancelled() const;
  // After Read() returned false: the call's status (Cancelled after Cancel()).
  absl::Status Finish();

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::SeqUpdate>> reader_;
  mutable std::mutex mu_;
  bool cancelled_ = false;
  bool finished_ = false;
};

}  // namespace moeshard::router
