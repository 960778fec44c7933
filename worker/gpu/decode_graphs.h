// CUDA graphs for decode steps: a step of T one-token sequences launches the same kernels
// with the same arguments whenever T is the same (the step arena hands out the same
// addresses for the same shapes; the step's ids, positions, slots and block tables are
// device data uploaded before the launch), so its ~25 launches per layer are recorded once
// per T and replayed as one graph. A recording that fails (an operation that cannot be
// captured) turns graphs off for the runner; the caller then runs the step eagerly.
// MOESHARD_CUDA_GRAPHS=0 turns them off. One stream, one thread.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <map>

#include "absl/status/status.h"

namespace moeshard::gpu {

class DecodeGraphs {
 public:
  DecodeGraphs();
  ~DecodeGraphs();
  bool enabled() const { return enabled_; }
  // Launches the graph recorded for `key`, recording `record` (which only enqueues work on
  // `stream`) first if there is none. Unavailable when graphs cannot be used: run eagerly.
  absl::Status Launch(int64_t key, cudaStream_t stream, const std::function<absl::Status()>& record);

 private:
  bool enabled_ = true;
  std::map<int64_t, cudaGraphExec_t> graphs_;
};

}  // namespace moeshard::gpu
