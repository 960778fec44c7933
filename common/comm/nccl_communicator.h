// NcclCommunicator: the Communicator of GPU workers, over NCCL (no nccl.h in this header).
// Bootstrap: rank 0 makes the NCCL unique id and publishes it in the KvStore under
// "<prefix>/nccl_id"; the others read it, then every rank calls ncclCommInitRankConfig
// with a non-blocking config. Every operation (the init included) is polled against the
// communicator's deadline: when it passes, or a peer's failure surfaces through
// ncclCommGetAsyncError, the communicator is aborted (ncclCommAbort) and the call returns
// DeadlineExceeded or Internal, naming the operation; later calls return Aborted.
// Buffers are device memory of `device` (device_memory() is true); work runs on the stream
// given to set_stream (default: a stream of its own) and is complete when a call returns.
// NCCL allows one rank per GPU: workers that share a GPU use the host communicators.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/comm/communicator.h"
#include "common/comm/kv_store.h"

namespace moeshard {

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(KvStore* store, const std::string& prefix,
                                                                     int rank, int size, int device,
                                                                     std::chrono::milliseconds timeout);

// "<PCI bus id>" of a GPU, so that ranks can tell whether they share one; error without one.
absl::StatusOr<std::string> GpuBusId(int device);

}  // namespace moeshard
