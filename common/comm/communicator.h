// The communicator: how workers exchange activations (the data plane), in the spirit of
// PyTorch's c10d ProcessGroup. Implementations: LocalCommunicator (threads of one process,
// for tests), GlooCommunicator (TCP between CPU workers), NcclCommunicator (GPUs; no
// nccl.h in any header). Every call returns a status; a call that does not complete by
// the deadline returns DeadlineExceeded and leaves the communicator aborted.
// Thread-safety: one thread issues the calls of one communicator; all ranks issue the
// same collectives in the same order. Abort() is the exception: any thread may call it,
// also while another call is pending.
// Send may block until the peer posts the matching Recv (Gloo and NCCL do; the local
// communicator buffers), so ranks must not all Send to each other before receiving.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace moeshard {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In-place elementwise sum over all ranks (fp32: partial sums cross workers in fp32).
  virtual absl::Status AllReduceSum(float* data, size_t count) = 0;
  // out[size * count]: rank r's `in` lands at out + r * count.
  virtual absl::Status AllGather(const float* in, size_t count, float* out) = 0;
  // Point to point, between stages of a pipeline. Bytes, so ids and floats both travel.
  virtual absl::Status Send(const void* data, size_t bytes, int dst) = 0;
  virtual absl::Status Recv(void* data, size_t bytes, int src) = 0;
  virtual absl::Status Barrier() = 0;
  // Makes every pending and later call fail fast (used when a peer is known dead).
  virtual void Abort() = 0;

  // Where the collectives' buffers live: false (default) host memory; true: device memory
  // of this rank's GPU, with the work ordered on the stream given to set_stream (a
  // cudaStream_t; null is the legacy default stream) and complete when the call returns.
  virtual bool device_memory() const { return false; }
  virtual void set_stream(void* stream) {}

  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 protected:
  std::chrono::milliseconds timeout_{std::chrono::seconds(60)};
};

}  // namespace moeshard
