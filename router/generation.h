// One generation request as the router runs it, whichever API it came through: choose a
// coordinator (cluster.h), stream its tokens, detokenize them with stop strings
// (common/tokenizer/detokenizer.h), and hand each update's new text and tokens to the caller.
//
// A coordinator that fails (its group lost a worker and aborted the sequence, the process
// died, the stream broke) is marked not ready and the request migrates: it waits, within
// RouterServices::migration_timeout of its start, for a ready coordinator (another one, or
// the same one once its group has healed) and is re-submitted with its prompt plus the
// tokens already streamed, so that the coordinator recomputes their KV in a prefill and
// the same stream continues. Sampling is seeded by (seed, position), so a greedy or seeded
// request continues exactly as an undisturbed run would. At most kMaxAttempts calls in all.
// A coordinator whose queue is full (ResourceExhausted) on the first attempt is not waited
// for: another one is tried at once, else the request gets Unavailable (503 + Retry-After).
// A stop string, max_tokens, the caller's callback
// returning false (client gone) and Router shutdown all cancel the coordinator's call
// (ClientContext::TryCancel), which frees the sequence there.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "router/cluster.h"
#include "router/openai_request.h"
#include "router/router_metrics.h"

namespace moeshard {
class Tokenizer;
}

namespace moeshard::router {

class Generation;

// The in-flight generations, so that shutdown can cancel them. Thread-safe.
class ActiveGenerations {
 public:
  void Add(Generation* g);
  void Remove(Generation* g);
  size_t size() const;
  void CancelAll();

 private:
  mutable std::mutex mu_;
  std::set<Generation*> active_;
};

// What every request shares; owned by the Router, outlives all requests.
struct RouterServices {
  std::string served_model_name;
  const Tokenizer* tokenizer = nullptr;  // null: token-id prompts only, no text out
  std::vector<int32_t> eos_ids;
  Cluster* cluster = nullptr;
  RouterMetrics* metrics = nullptr;
  ActiveGenerations* active = nullptr;
  std::atomic<bool>* shutting_down = nullptr;
  absl::Duration migration_timeout = absl::Seconds(60);
  // A new request that finds no ready pool while the cluster heals (it was ready before) waits
  // this long for one before it gets 503.
  absl::Duration heal_wait = absl::Seconds(10);
  int64_t max_prompt_bytes = 4 << 20;  // prompt text, checked before tokenizing
};

// A tokenized request, ready to dispatch.
struct PreparedRequest {
  std::string request_id;
  std::vector<int32_t> prompt_ids;
  GenerationParams params;
};

struct TokenInfo {
  int32_t id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the most likely alternatives
};

// What one coordinator update adds to the output.
struct GenerationDelta {
  std::string text;
  std::vector<TokenInfo> tokens;
};

struct GenerationResult {
  std::string finish_reason;  // stop | length
  // vLLM's stop_reason: the stop string or stop token id that ended the output.
  std::optional<std::string> stop_string;
  std::optional<int32_t> stop_token_id;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
};

class Generation {
 public:
  static constexpr int kMaxAttempts = 4;
  using DeltaCallback = std::function<bool(const GenerationDelta&)>;

  // Chooses the pool and coordinator (waiting up to heal_wait while the cluster heals).
  // Errors: InvalidArgument context_length_exceeded, Unavailable (no ready pool, or the router
  // is shutting down).
  static absl::StatusOr<std::unique_ptr<Generation>> Start(const RouterServices& services, PreparedRequest request);
  ~Generation();

  const std::string& pool() const { return lease_.pool(); }
  int64_t prompt_tokens() const { return static_cast<int64_t>(request_.prompt_ids.size()); }

  // Streams the output to `on_delta` (updates that add tokens or text). Returns the
  // result, or Cancelled when `on_delta` returned false, or Unavailable / Internal when
  // the coordinators failed.
  absl::StatusOr<GenerationResult> Run(const DeltaCallback& on_delta);

  // From any thread: makes Run() return Unavailable soon (shutdown).
  void Cancel();

 private:
  Generation(const RouterServices& services, PreparedRequest request, Lease lease);
  v1::SeqRequest MakeSeqRequest() const;
  // After a failed call: the lease of the coordinator that continues the request, waiting for
  // one to be ready until the migration deadline (or at once when `wait` is false).
  absl::Status Migrate(const std::vector<std::string>& failed, bool wait);
  bool cancelled();

  const RouterServices& services_;
  const PreparedRequest request_;
  Lease lease_;
  std::chrono::steady_clock::time_point start_;
  std::vector<int32_t> generated_;  // the tokens streamed so far (a migration resubmits them)
  std::mutex mu_;
  GenerateCall* call_ = nullptr;  // the running call, guarded by mu_
  bool cancelled_ = false;        // guarded by mu_
};

}  // namespace moeshard::router
