// The coordinator's engine: owns the plan, the scheduler and the KV block manager, and
// drives the workers. A loop thread forms steps (continuous batching, chunked prefill;
// in layer split up to one micro-batch per stage in flight so that stages overlap), sends
// each to every worker, and turns the sampled tokens into per-sequence updates.
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
#include "coordinator/plan.h"
#include "coordinator/scheduler.h"
#include "coordinator/step_deadline.h"
#include "coordinator/worker_pool.h"
#include "common/status.h"
#include "proto/moeshard.pb.h"

namespace moeshard {

struct EngineOptions {
  ModelConfig config;
  Plan plan;
  std::vector<std::string> workers;
  std::string store_address;
  int64_t num_kv_blocks = 1024;
  int32_t block_size = 16;
  int64_t max_num_seqs = 64;
  int64_t max_tokens_per_step = 512;
  int64_t max_model_len = 4096;
  bool prefix_caching = true;
  int64_t comm_timeout_ms = 60000;
  std::string model_name;
  AdmissionConfig admission;
  StepDeadlineConfig step_deadline;  // the engine sets its ceiling: 4 x comm_timeout_ms + 60 s
  // Consecutive handshakes a worker refuses for good (wrong model, bad weights, wrong protocol)
  // before the engine gives up (WaitFatal returns).
  int max_handshake_refusals = 3;
};

// Updates of one sequence, consumed by the gRPC Generate handler.
struct SeqStream {
  int64_t seq_id = 0;
  std::string request_id;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<v1::SeqUpdate> updates;
  bool done = false;
};

class Engine {
 public:
  explicit Engine(EngineOptions options);
  ~Engine();
  // Handshakes the workers and starts the loop; retries the handshake in the background
  // when it fails (workers still starting).
  void Start();
  void Stop();

  // The address workers reach this coordinator's store at (set before Start).
  void SetStoreAddress(const std::string& address) { o_.store_address = address; }
  std::shared_ptr<prometheus::Registry> registry() const { return metrics_.registry(); }

  absl::StatusOr<std::shared_ptr<SeqStream>> Submit(const v1::SeqRequest& request);
  void Cancel(int64_t seq_id);
  v1::StatusReply GetStatus();
  // Blocks until the engine cannot go on (the workers refuse the handshake for good) and returns
  // why, or returns "" once Stop() was called.
  std::string WaitFatal();

 private:
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
  WorkerPool workers_;
  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<Scheduler> scheduler_;
  std::map<int64_t, std::shared_ptr<SeqStream>> streams_;
  std::map<int64_t, SeqTiming> timing_;
  std::map<int64_t, int64_t> remaining_;  // prompt + max new tokens, for the load report
  std::vector<int64_t> released_;
  int64_t next_seq_id_ = 1, next_step_id_ = 0, in_flight_ = 0;
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
