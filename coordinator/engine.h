// The engine: owns the plan, the scheduler and the KV block manager, and drives a
// WorkerPool (worker processes over gRPC in a cluster, model runners in this process for
// `moeshard generate` / `check`, a fake in tests). A loop thread forms steps (continuous batching, chunked prefill;
// in layer split up to one micro-batch per stage in flight so that stages overlap; with one
// worker, a lookahead step in flight behind the running one), sends each to every worker, and
// turns the sampled tokens into per-sequence updates, step by step in order.
// It speaks plain structs; coordinator/wire.h converts them to and from protobuf.
// Thread-safety: Submit/Cancel/GetStatus may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "coordinator/admission.h"
#include "coordinator/block_manager.h"
#include "coordinator/coordinator_metrics.h"
#include "common/model/kv_pools.h"
#include "coordinator/plan.h"
#include "coordinator/scheduler.h"
#include "coordinator/step_deadline.h"
#include "coordinator/worker_pool.h"
#include "common/status.h"

namespace moeshard {

struct EngineOptions {
  ModelConfig config;
  Plan plan;
  std::string store_address;
  int64_t num_kv_blocks = 1024;
  // > 0 for a model with both full and sliding-window layers: the sliding layers' own pool
  // (common/model/kv_pools.h gives the default); 0: one pool for every layer.
  int64_t num_sliding_kv_blocks = 0;
  int32_t block_size = 16;
  int64_t max_num_seqs = 64;
  int64_t max_tokens_per_step = 512;
  int64_t max_model_len = 4096;
  bool prefix_caching = true;
  int64_t comm_timeout_ms = 60000;
  std::string model_name;
  AdmissionConfig admission;
  StepDeadlineConfig step_deadline;  // the engine sets its ceiling: 4 x comm_timeout_ms + 60 s
  // Lookahead (coordinator/scheduler.h) where the group runs it (one worker with the whole model):
  // the next decode step is sent while the current one runs, so the worker starts it as soon as
  // it has drawn the tokens, without waiting for the round trip through this process.
  bool lookahead = true;
  // Consecutive handshakes a worker refuses for good (wrong model, bad weights, wrong protocol)
  // before the engine gives up (WaitFatal returns).
  int max_handshake_refusals = 3;
};

// One generation request.
struct EngineRequest {
  std::string request_id;  // for logs
  std::vector<int32_t> prompt_ids;
  int64_t max_tokens = 0;  // 0: up to max_model_len
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // always stop (besides the model's EOS ids)
  bool ignore_eos = false;
  bool logprobs = false;
  int32_t top_logprobs = 0;  // at most 20
};

// What one step added to a sequence.
struct SeqUpdate {
  std::vector<TokenOutput> tokens;  // never a stop / EOS token
  std::string finish_reason;        // on the last update: "stop", "length" or "abort"
  std::string error;                // with "abort": why (a worker failed, the group was lost)
  int32_t cached_tokens = -1;       // >= 0 on the first scheduled step: prompt tokens from the prefix cache
  int32_t prompt_tokens = 0;        // set with cached_tokens
};

// Updates of one sequence, consumed by the gRPC Generate handler or an in-process caller.
struct SeqStream {
  int64_t seq_id = 0;
  std::string request_id;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<SeqUpdate> updates;
  bool done = false;
};

struct EngineStatus {
  bool ready = false;  // workers handshaken and a step went through
  int64_t outstanding_tokens = 0;
  int32_t num_running = 0, num_waiting = 0;
  int64_t max_model_len = 0;
  std::string model;
  int64_t vocab_size = 0;
  double kv_usage = 0;
  bool queue_full = false;  // admission control refuses a request of average size now
  std::string error;
};

class Engine {
 public:
  Engine(EngineOptions options, std::unique_ptr<WorkerPool> workers);
  ~Engine();
  // Handshakes the workers and starts the loop; retries the handshake in the background
  // when it fails (workers still starting).
  void Start();
  void Stop();

  // The address workers reach this coordinator's store at (set before Start).
  void SetStoreAddress(const std::string& address) { o_.store_address = address; }
  std::shared_ptr<prometheus::Registry> registry() const { return metrics_.registry(); }

  // Errors: InvalidArgument (empty prompt, ids outside the vocabulary, too long, bad
  // sampling), Unavailable (workers not ready), ResourceExhausted (admission refused).
  absl::StatusOr<std::shared_ptr<SeqStream>> Submit(const EngineRequest& request);
  // Frees the sequence; its stream is marked done with no further update.
  void Cancel(int64_t seq_id);
  EngineStatus GetStatus();
  // Blocks until the workers are handshaken and a step went through (true), or until the
  // engine gives up (false; WaitFatal's reason) or `timeout` passes (false).
  bool WaitReady(std::chrono::milliseconds timeout);
  // Blocks until the engine cannot go on (the workers refuse the handshake for good) and returns
  // why, or returns "" once Stop() was called.
  std::string WaitFatal();

 private:
  // The sliding pool's blocks: 0 unless the model has both layer kinds.
  int64_t SlidingBlocks() const { return HasBothLayerKinds(o_.config) ? std::max<int64_t>(o_.num_sliding_kv_blocks, 0) : 0; }
  void Loop();
  void RunStep(StepPlan plan, std::vector<int64_t> released, int64_t step_id, std::chrono::milliseconds deadline);
  void OnConnectFailed(const absl::Status& status);
  // While idle: pings every worker each kHeartbeatInterval; one that does not answer in twice that
  // makes the group unhealthy (re-formed like after a failed step). Called with mu_ held.
  void Heartbeat(std::unique_lock<std::mutex>& l);
  static constexpr std::chrono::milliseconds kHeartbeatInterval{1000};
  // Requests submitted but not yet in a step, and their prompt tokens (requires mu_).
  std::pair<int64_t, int64_t> Queued() const;
  void Deliver(const std::vector<SeqEvent>& events);
  void FailAll(const std::string& why);
  absl::Status Connect();

  EngineOptions o_;
  CoordinatorMetrics metrics_;
  std::unique_ptr<WorkerPool> workers_;
  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<Scheduler> scheduler_;
  std::map<int64_t, std::shared_ptr<SeqStream>> streams_;
  std::map<int64_t, SeqTiming> timing_;
  std::map<int64_t, int64_t> remaining_;  // prompt + max new tokens, for the load report
  std::vector<int64_t> released_;
  int64_t next_seq_id_ = 1, next_step_id_ = 0, in_flight_ = 0;
  int64_t applied_through_ = -1;  // the results of steps [0, this] are applied (in order)
  bool lookahead_ = false;        // o_.lookahead and the group runs it (set by Connect)
  std::chrono::milliseconds in_flight_deadline_{0};  // of the newest step in flight
  std::chrono::steady_clock::time_point last_reply_{};  // when the last applied step's reply came
  bool connected_ = false, stop_ = false;
  int generation_ = 0;
  std::string error_;
  std::chrono::steady_clock::time_point last_ok_step_{};
  AdmissionControl admission_;
  StepDeadline step_deadline_;
  int num_refusals_ = 0;
  std::chrono::steady_clock::time_point last_heartbeat_{};
  std::string fatal_;
  std::thread loop_;
};

}  // namespace moeshard
