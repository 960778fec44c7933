// What the worker checks in a handshake or a step before it acts on it: every field in
// range, every size bounded. A handshake is checked in full before the live communicator
// group is torn down, so that a refused one costs nothing; refusals never echo secrets or
// the model's fingerprint.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/model/model_config.h"
#include "proto/moeshard.pb.h"

namespace moeshard {

struct WorkerLimits {
  int64_t max_kv_bytes = 0;     // KV cache this worker may allocate (an upper estimate is checked)
  int32_t max_block_size = 4096;
  int32_t max_workers = 1024;
  int64_t max_timeout_ms = 3600 * 1000;
  int64_t max_step_chunks = 65536;
  int64_t max_step_tokens = 1 << 20;
  int64_t max_released_seqs = 1 << 20;
};

// Limits for this machine: the KV cache may take at most half of the physical memory on the
// CPU (the GPU runner's allocation fails cleanly on its own), 1 TiB otherwise.
WorkerLimits DefaultWorkerLimits(bool cpu);

// The handshake against the model this worker loaded and the limits.
absl::Status ValidateHandshake(const v1::HandshakeRequest& req, const ModelConfig& config, const WorkerLimits& limits);

// The step's sizes, and that no two chunks write the same KV slot.
absl::Status ValidateStep(const v1::StepRequest& req, int32_t block_size, const WorkerLimits& limits);

}  // namespace moeshard
