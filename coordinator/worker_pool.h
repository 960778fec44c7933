// The coordinator's view of its workers, as an interface: the gRPC pool (grpc_worker_pool.h)
// drives worker processes, the in-process pool (local/inprocess_worker_pool.h) drives model
// runners inside this process, and tests drive fakes. Plain structs only.
//
// Contract: Handshake hands every worker its slice of the plan and a fresh KV pool of
// num_kv_blocks blocks of block_size positions (previous state is dropped). Step runs one
// step on every worker, in step_id order (0, 1, ... after each handshake); it returns one
// sampled token per chunk with `sample` set (a chunk missing from the result is retried by
// the scheduler). Any worker's failure fails the step; the engine then re-handshakes.
// released_seqs names sequences whose per-sequence state (sampler) may be dropped.
// Thread-safety: Step may be called from several threads (one per micro-batch in flight);
// Handshake must not run concurrently with Step. Ping may run at any time.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/plan.h"
#include "coordinator/scheduler.h"

namespace moeshard {

struct HandshakeOptions {
  std::string model_fingerprint;
  std::string store_address;  // this coordinator's gRPC address
  std::string group_id;
  int64_t num_kv_blocks = 0;
  int64_t num_sliding_kv_blocks = 0;  // > 0: the sliding-window layers' own pool (ChunkPlan.sliding_table)
  int32_t block_size = 16;
  int64_t timeout_ms = 60000;
};

// One sampled token; logprob and top are set when the chunk asked for them.
struct TokenOutput {
  int32_t token_id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // (token id, logprob), most likely first
};

struct StepRequest {
  int64_t step_id = 0;
  std::vector<ChunkPlan> chunks;
  std::vector<int64_t> released_seqs;
  std::vector<int64_t> preempted_seqs;  // preempted by this step's planning (their KV is given up)
};

struct StepResult {
  std::vector<std::pair<int64_t, TokenOutput>> tokens;  // (seq_id, token), in chunk order
};

class WorkerPool {
 public:
  virtual ~WorkerPool() = default;
  virtual int size() const = 0;
  // Every worker answers within `deadline` (a stopped or hung one does not): checked before
  // a handshake, whose communicator rendezvous would otherwise wait for a dead peer.
  virtual absl::Status Ping(std::chrono::milliseconds deadline) = 0;
  // Errors: FailedPrecondition / InvalidArgument / NotFound / DataLoss for refusals that
  // another attempt cannot fix (wrong model, protocol, plan), Unavailable otherwise.
  virtual absl::Status Handshake(const Plan& plan, const HandshakeOptions& options) = 0;
  // Errors name the worker; DeadlineExceeded-like failures say the deadline. Steps may be
  // called from several threads at once (up to two in flight with lookahead); the pool runs
  // them in step_id order.
  virtual absl::StatusOr<StepResult> Step(const StepRequest& request, std::chrono::milliseconds deadline) = 0;
  // Whether the handshaken group runs lookahead chunks (ChunkPlan::follow): one worker that
  // embeds the tokens it samples.
  virtual bool FollowsTokens() const { return false; }
};

}  // namespace moeshard
