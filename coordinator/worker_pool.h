// The coordinator's view of its workers: gRPC stubs, the handshake that hands each worker
// its slice of the plan (all concurrently, since the communicator rendezvous needs every
// rank), and steps sent to all workers at once.
// Thread-safety: Step may be called from several threads (one per micro-batch in flight);
// Handshake must not run concurrently with Step.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/plan.h"
#include "proto/moeshard.grpc.pb.h"

namespace moeshard {

struct HandshakeOptions {
  std::string model_fingerprint;
  std::string store_address;  // this coordinator's gRPC address
  std::string group_id;
  int64_t num_kv_blocks = 0;
  int32_t block_size = 16;
  int64_t timeout_ms = 60000;
};

class WorkerPool {
 public:
  explicit WorkerPool(std::vector<std::string> addresses);
  int size() const { return static_cast<int>(stubs_.size()); }
  const std::vector<std::string>& addresses() const { return addresses_; }

  // Every worker answers a Ping within `deadline` (a stopped or hung process does not): checked
  // before a handshake, whose communicator rendezvous would otherwise wait for a dead peer.
  absl::Status Ping(std::chrono::milliseconds deadline);
  absl::Status Handshake(const Plan& plan, const HandshakeOptions& options);
  // Sends the step to every worker; returns the reply of the worker that samples
  // (last stage, tensor-parallel rank 0). Any worker's error, or one that misses the
  // deadline, fails the step (DeadlineExceeded names the worker).
  absl::StatusOr<v1::StepReply> Step(const v1::StepRequest& request, std::chrono::milliseconds deadline);

 private:
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<v1::Worker::Stub>> stubs_;
  int sampler_worker_ = 0;
};

}  // namespace moeshard
