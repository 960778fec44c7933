// The WorkerPool of single-process commands (`moeshard generate`, `check`): one "worker"
// that is a ModelRunner in this process (one runner, or worker/inprocess_group.h's tensor
// parallel / layer-split compositions of several), driven by the same Engine as a cluster,
// so that scheduling, sampling and stop handling exist once. The vLLM analogue is the
// offline LLM running its EngineCore in-process.
//
// A step runs Forward on the runner, then draws the sampled rows with the worker's
// SamplerSet (worker/sampler.h), exactly as a worker process's last stage does, and runs
// lookahead chunks as a worker process does (worker/follow_tokens.h).
// Thread-safety: as WorkerPool; steps run one at a time, in step_id order.
#pragma once

#include <memory>
#include <condition_variable>
#include <mutex>

#include "coordinator/worker_pool.h"
#include "worker/model_runner.h"
#include "worker/follow_tokens.h"
#include "worker/sampler.h"

namespace moeshard {

class InProcessWorkerPool final : public WorkerPool {
 public:
  // Drives `runner` (owned). The engine's KV pool must be the runner's: Handshake refuses a
  // num_kv_blocks or block_size other than runner->options()'s (FailedPrecondition).
  explicit InProcessWorkerPool(std::unique_ptr<ModelRunner> runner);
  // Drives `runner` (not owned; must outlive the pool), under the same contract.
  explicit InProcessWorkerPool(ModelRunner* runner);

  int size() const override { return 1; }
  absl::Status Ping(std::chrono::milliseconds) override { return absl::OkStatus(); }
  absl::Status Handshake(const Plan& plan, const HandshakeOptions& options) override;
  absl::StatusOr<StepResult> Step(const StepRequest& request, std::chrono::milliseconds deadline) override;
  bool FollowsTokens() const override { return true; }

 private:
  absl::StatusOr<StepResult> RunStep(const StepRequest& request);  // with mu_ held, in its turn

  std::unique_ptr<ModelRunner> owned_;
  ModelRunner* runner_;
  std::mutex mu_;  // serializes steps
  std::condition_variable turn_;
  int64_t next_step_ = 0;  // the step whose turn it is (the engine numbers steps from 0 after a handshake)
  SamplerSet samplers_;
  FollowTokens follow_;
};

}  // namespace moeshard
