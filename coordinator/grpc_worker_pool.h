// The WorkerPool of a cluster: worker processes reached over gRPC. The handshake hands each
// worker its slice of the plan (all concurrently, since the communicator rendezvous needs
// every rank); a step goes to all workers at once and the reply of the worker that samples
// (last stage, tensor-parallel rank 0) is returned. A chunk's block table goes from what every
// worker already holds on (table_deltas.h).
// Thread-safety: as WorkerPool.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "coordinator/table_deltas.h"
#include "coordinator/worker_pool.h"
#include "proto/moeshard.grpc.pb.h"

namespace moeshard {

class GrpcWorkerPool final : public WorkerPool {
 public:
  explicit GrpcWorkerPool(std::vector<std::string> addresses);
  int size() const override { return static_cast<int>(stubs_.size()); }
  const std::vector<std::string>& addresses() const { return addresses_; }

  absl::Status Ping(std::chrono::milliseconds deadline) override;
  absl::Status Handshake(const Plan& plan, const HandshakeOptions& options) override;
  // A worker that misses the deadline fails the step with a message naming it.
  absl::StatusOr<StepResult> Step(const StepRequest& request, std::chrono::milliseconds deadline) override;
  bool FollowsTokens() const override { return follows_; }

 private:
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<v1::Worker::Stub>> stubs_;
  int sampler_worker_ = 0;
  bool follows_ = false;  // one worker with the whole model (set by Handshake)
  TableDeltas deltas_;  // which table entries the workers hold: steps send the rest
};

}  // namespace moeshard
