// The NCCL entry points for builds without CUDA or NCCL.
#include "common/comm/nccl_communicator.h"

namespace moeshard {

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(KvStore*, const std::string&, int, int, int,
                                                                     std::chrono::milliseconds) {
  return absl::UnimplementedError("this moeshard was built without NCCL");
}

absl::StatusOr<std::string> GpuBusId(int) { return absl::UnimplementedError("this moeshard was built without CUDA"); }

}  // namespace moeshard
