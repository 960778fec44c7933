#include "coordinator/engine.h"

#include <cstdio>
#include <random>

#include "absl/strings/str_cat.h"

namespace moeshard {
namespace {

StepDeadlineConfig WithCeiling(StepDeadlineConfig c, int64_t comm_timeout_ms) {
  c.ceiling = std::chrono::milliseconds(comm_timeout_ms * 4 + 60000);
  c.floor = std::min(c.floor, c.ceiling);
  return c;
}

// A refusal that another attempt with the same processes cannot fix.
bool IsPermanentRefusal(const absl::Status& st) {
  switch (st.code()) {
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
      return true;
    default:
      return false;
  }
}

}  // namespace

Engine::Engine(EngineOptions options, std::unique_ptr<WorkerPool> workers)
    : o_(std::move(options)),
      workers_(std::move(workers)),
      admission_(o_.admission),
      step_deadline_(WithCeiling(o_.step_deadline, o_.comm_timeout_ms)) {}

Engine::~Engine() { Stop(); }

void Engine::Start() { loop_ = std::thread([this] { Loop(); }); }

void Engine::Stop() {
  {
    std::unique_lock<std::mutex> l(mu_);
    stop_ = true;
    cv_.notify_all();
    cv_.wait_for(l, std::chrono::seconds(30), [&] { return in_flight_ == 0; });
  }
  if (loop_.joinable()) loop_.join();
}

absl::Status Engine::Connect() {
  std::mt19937_64 rng(std::random_device{}());
  HandshakeOptions ho;
  ho.model_fingerprint = o_.config.Fingerprint();
  ho.store_address = o_.store_address;
  ho.group_id = absl::StrCat("g", rng(), "-", generation_++);
  ho.num_kv_blocks = o_.num_kv_blocks;
  ho.num_sliding_kv_blocks = SlidingBlocks();
  ho.block_size = o_.block_size;
  ho.timeout_ms = o_.comm_timeout_ms;
  RETURN_IF_ERROR(workers_->Ping(std::chrono::milliseconds(2000)));
  absl::Status st = workers_->Handshake(o_.plan, ho);
  if (!st.ok()) return st;
  std::lock_guard<std::mutex> l(mu_);
  blocks_ = std::make_unique<BlockManager>(o_.num_kv_blocks, o_.block_size, o_.prefix_caching, SlidingBlocks(),
                                           o_.config.sliding_window);
  SchedulerConfig sc;
  sc.max_num_seqs = o_.max_num_seqs;
  sc.max_tokens_per_step = std::max(o_.max_tokens_per_step, o_.max_num_seqs);
  sc.max_model_len = o_.max_model_len;
  scheduler_ = std::make_unique<Scheduler>(sc, blocks_.get());
  next_step_id_ = 0;
  applied_through_ = -1;
  last_reply_ = {};
  lookahead_ = o_.lookahead && workers_->FollowsTokens();
  released_.clear();
  // A warm-up sequence: readiness means a real step went through every worker.
  SeqRequest warm;
  warm.seq_id = next_seq_id_++;
  warm.prompt = {0};
  warm.max_new_tokens = 1;
  warm.ignore_eos = true;
  RETURN_IF_ERROR(scheduler_->Add(warm));
  connected_ = true;
  error_.clear();
  last_ok_step_ = {};
  cv_.notify_all();
  return absl::OkStatus();
}

void Engine::Loop() {
  while (true) {
    bool need_connect;
    {
      std::unique_lock<std::mutex> l(mu_);
      if (stop_) return;
      need_connect = !connected_;
      if (need_connect) cv_.wait(l, [&] { return stop_ || in_flight_ == 0; });
      if (stop_) return;
    }
    if (need_connect) {
      absl::Status st = Connect();
      if (!st.ok()) {
        OnConnectFailed(st);
      } else {
        const std::string sliding =
            SlidingBlocks() > 0 ? absl::StrCat(", sliding-window layers ", SlidingBlocks(), " (window ", o_.config.sliding_window, ")")
                                : std::string();
        std::fprintf(stderr, "moeshard-coordinator: %d workers handshaken; KV blocks of %d: %ld%s\n", workers_->size(),
                     o_.block_size, static_cast<long>(o_.num_kv_blocks), sliding.c_str());
      }
      continue;
    }
    std::unique_lock<std::mutex> l(mu_);
    metrics_.running->Set(static_cast<double>(scheduler_->num_running()));
    metrics_.waiting->Set(static_cast<double>(scheduler_->num_waiting()));
    metrics_.SetKv(*blocks_);
    if (connected_ && in_flight_ == 0 && !scheduler_->HasWork()) {
      Heartbeat(l);
      continue;
    }
    const int64_t max_in_flight =
        std::max<int64_t>(o_.plan.mode == ParallelMode::kLayerSplit ? o_.plan.pp_size : 1, lookahead_ ? 2 : 1);
    if (!connected_ || in_flight_ >= max_in_flight || !scheduler_->HasWork()) {
      cv_.wait_for(l, std::chrono::milliseconds(100));
      continue;
    }
    std::optional<StepPlan> plan = scheduler_->Schedule(lookahead_);
    if (!plan) {
      cv_.wait_for(l, std::chrono::milliseconds(100));
      continue;
    }
    auto now = std::chrono::steady_clock::now();
    for (const auto& c : plan->chunks) {
      if (c.follow) metrics_.lookahead_chunks->Increment();
      auto it = timing_.find(c.seq_id);
      if (it != timing_.end() && !it->second.scheduled) {
        it->second.scheduled = true;
        it->second.first_scheduled = now;
        admission_.OnDequeued(now);
      }
    }
    // Until a step went through the (re-formed) group its time is unknown: the warm-up step
    // pages weights in and gets the ceiling.
    const bool warm = last_ok_step_ != std::chrono::steady_clock::time_point{};
    std::chrono::milliseconds deadline = warm ? step_deadline_.For(plan->num_tokens()) : step_deadline_.ceiling();
    // Behind a step in flight (lookahead) a step also waits for that one to run.
    if (lookahead_ && in_flight_ > 0) deadline = std::min(deadline + in_flight_deadline_, step_deadline_.ceiling());
    in_flight_deadline_ = deadline;
    int64_t step_id = next_step_id_++;
    ++in_flight_;
    // The sequences released so far go with this step, taken as it is planned: a step planned
    // later may reuse their blocks, and the workers must hear of the release first.
    std::vector<int64_t> released = std::move(released_);
    released_.clear();
    std::thread([this, p = std::move(*plan), step_id, deadline, r = std::move(released)]() mutable {
      RunStep(std::move(p), std::move(r), step_id, deadline);
    }).detach();
  }
}

void Engine::Heartbeat(std::unique_lock<std::mutex>& l) {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_heartbeat_ < kHeartbeatInterval) {
    cv_.wait_for(l, std::chrono::milliseconds(100));
    return;
  }
  last_heartbeat_ = now;
  l.unlock();
  absl::Status st = workers_->Ping(2 * kHeartbeatInterval);
  l.lock();
  if (st.ok() || !connected_) return;
  std::fprintf(stderr, "moeshard-coordinator: heartbeat failed: %s\n", std::string(st.message()).c_str());
  connected_ = false;
  error_ = std::string(st.message());
  FailAll(error_);
}

void Engine::OnConnectFailed(const absl::Status& st) {
  std::fprintf(stderr, "moeshard-coordinator: workers not ready: %s\n", std::string(st.message()).c_str());
  std::unique_lock<std::mutex> l(mu_);
  error_ = std::string(st.message());
  num_refusals_ = IsPermanentRefusal(st) ? num_refusals_ + 1 : 0;
  if (num_refusals_ >= o_.max_handshake_refusals) {
    fatal_ = absl::StrCat("the workers refused ", num_refusals_, " handshakes in a row: ", st.message());
    cv_.notify_all();
  }
  cv_.wait_for(l, std::chrono::seconds(1), [&] { return stop_; });
}

std::string Engine::WaitFatal() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return stop_ || !fatal_.empty(); });
  return fatal_;
}

std::pair<int64_t, int64_t> Engine::Queued() const {
  int64_t requests = 0, tokens = 0;
  for (const auto& [id, t] : timing_) {
    if (t.scheduled) continue;
    ++requests;
    tokens += t.prompt_tokens;
  }
  return {requests, tokens};
}

void Engine::RunStep(StepPlan plan, std::vector<int64_t> released, int64_t step_id, std::chrono::milliseconds deadline) {
  StepRequest req;
  req.step_id = step_id;
  req.chunks = plan.chunks;  // the plan itself goes back to the scheduler below
  req.released_seqs = std::move(released);
  req.preempted_seqs = plan.preempted;
  auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<StepResult> rep = workers_->Step(req, deadline);
  const auto replied = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> l(mu_);
  // Results apply in step order: a lookahead step's chunks extend the step before it. (Every
  // step of a group is applied before the engine reconnects: Connect waits for in_flight_ == 0.)
  cv_.wait(l, [&] { return applied_through_ + 1 >= step_id; });
  // The worker started this step when it had finished the one before, if that was later.
  const auto started = lookahead_ ? std::max(t0, last_reply_) : t0;
  applied_through_ = step_id;
  last_reply_ = replied;
  --in_flight_;
  cv_.notify_all();
  if (!rep.ok()) {
    metrics_.steps_failed->Increment();
    std::fprintf(stderr, "moeshard-coordinator: step %ld failed: %s\n", static_cast<long>(step_id),
                 std::string(rep.status().message()).c_str());
    if (connected_) {
      connected_ = false;
      error_ = std::string(rep.status().message());
      FailAll(error_);
    }
    return;
  }
  if (!connected_) return;  // a failure of another step already reset the engine
  metrics_.steps_ok->Increment();
  const std::chrono::duration<double> took = replied - started;
  metrics_.step_time->Observe(took.count());
  step_deadline_.Observe(plan.num_tokens(), took);
  last_ok_step_ = std::chrono::steady_clock::now();
  std::vector<std::pair<int64_t, int32_t>> sampled;
  std::map<int64_t, const TokenOutput*> outputs;
  for (const auto& [seq_id, out] : rep->tokens) {
    sampled.push_back({seq_id, out.token_id});
    outputs[seq_id] = &out;
  }
  std::vector<SeqEvent> events = scheduler_->OnStepDone(plan, sampled);
  auto now = std::chrono::steady_clock::now();
  for (const SeqEvent& e : events) {
    if (e.preempted) metrics_.preemptions->Increment();
    auto sit = streams_.find(e.seq_id);
    if (sit == streams_.end()) {
      if (e.finished) released_.push_back(e.seq_id);
      continue;
    }
    SeqStream& s = *sit->second;
    SeqTiming& t = timing_[e.seq_id];
    SeqUpdate u;
    if (e.num_cached_tokens >= 0) {
      u.cached_tokens = static_cast<int32_t>(e.num_cached_tokens);
      u.prompt_tokens = static_cast<int32_t>(t.prompt_tokens);
      metrics_.prefix_queries->Increment(static_cast<double>(t.prompt_tokens));
      metrics_.prefix_hits->Increment(static_cast<double>(e.num_cached_tokens));
      metrics_.prompt_tokens->Increment(static_cast<double>(t.prompt_tokens - e.num_cached_tokens));
    }
    if (e.token && !e.is_stop_token) {
      auto o = outputs.find(e.seq_id);
      TokenOutput out = o != outputs.end() ? *o->second : TokenOutput{};
      out.token_id = *e.token;
      u.tokens.push_back(std::move(out));
      metrics_.generation_tokens->Increment();
      if (!t.has_token) {
        t.has_token = true;
        t.first_token = now;
        metrics_.ttft->Observe(std::chrono::duration<double>(now - t.arrival).count());
      } else {
        metrics_.itl->Observe(std::chrono::duration<double>(now - t.last_token).count());
      }
      t.last_token = now;
      ++t.generated;
    }
    if (e.finished) {
      u.finish_reason = e.finish_reason;
      metrics_.Finished(t, e.finish_reason);
      released_.push_back(e.seq_id);
    }
    {
      std::lock_guard<std::mutex> sl(s.mu);
      if (!u.tokens.empty() || !u.finish_reason.empty() || e.num_cached_tokens >= 0) s.updates.push_back(std::move(u));
      if (e.finished) s.done = true;
    }
    s.cv.notify_all();
    if (e.finished) {
      streams_.erase(sit);
      timing_.erase(e.seq_id);
      remaining_.erase(e.seq_id);
    }
  }
  metrics_.SetKv(*blocks_);
}

void Engine::FailAll(const std::string& why) {
  for (auto& [id, s] : streams_) {
    SeqUpdate u;
    u.finish_reason = "abort";
    u.error = why;
    metrics_.Finished(timing_[id], "abort");
    {
      std::lock_guard<std::mutex> sl(s->mu);
      s->updates.push_back(u);
      s->done = true;
    }
    s->cv.notify_all();
  }
  streams_.clear();
  timing_.clear();
  remaining_.clear();
}

absl::StatusOr<std::shared_ptr<SeqStream>> Engine::Submit(const EngineRequest& r) {
  if (r.prompt_ids.empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (int32_t id : r.prompt_ids) {
    if (id < 0 || id >= o_.config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is outside the vocabulary of ", o_.config.vocab_size));
    }
  }
  const int64_t n = static_cast<int64_t>(r.prompt_ids.size());
  if (n >= o_.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", n, " tokens; this model serves at most ", o_.max_model_len, " in all"));
  }
  if (r.max_tokens < 0) return absl::InvalidArgumentError("max_tokens must not be negative");
  SeqRequest sr;
  sr.prompt = r.prompt_ids;
  sr.max_new_tokens = r.max_tokens == 0 ? o_.max_model_len - n : std::min<int64_t>(r.max_tokens, o_.max_model_len - n);
  sr.stop_token_ids = r.stop_token_ids;
  sr.eos_token_ids = o_.config.eos_token_ids;
  sr.ignore_eos = r.ignore_eos;
  sr.sampling = r.sampling;
  sr.logprobs = r.logprobs;
  sr.top_logprobs = std::min(r.top_logprobs, 20);
  std::lock_guard<std::mutex> l(mu_);
  if (!connected_) return absl::UnavailableError(absl::StrCat("workers are not ready: ", error_));
  const auto [queued_requests, queued_tokens] = Queued();
  AdmissionDecision admit = admission_.Admit(queued_requests, queued_tokens, n, std::chrono::steady_clock::now());
  if (!admit.admitted()) {
    metrics_.Rejected(RejectReasonName(admit.reason));
    return absl::ResourceExhaustedError(admit.message);
  }
  sr.seq_id = next_seq_id_++;
  RETURN_IF_ERROR(scheduler_->Add(sr));
  auto s = std::make_shared<SeqStream>();
  s->seq_id = sr.seq_id;
  s->request_id = r.request_id;
  streams_[sr.seq_id] = s;
  SeqTiming& t = timing_[sr.seq_id];
  t.arrival = std::chrono::steady_clock::now();
  t.prompt_tokens = n;
  remaining_[sr.seq_id] = n + sr.max_new_tokens;
  cv_.notify_all();
  return s;
}

void Engine::Cancel(int64_t seq_id) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = streams_.find(seq_id);
  if (it == streams_.end()) return;
  if (scheduler_) scheduler_->Abort(seq_id);
  released_.push_back(seq_id);
  metrics_.Finished(timing_[seq_id], "abort");
  {
    std::lock_guard<std::mutex> sl(it->second->mu);
    it->second->done = true;
  }
  it->second->cv.notify_all();
  streams_.erase(it);
  timing_.erase(seq_id);
  remaining_.erase(seq_id);
  if (blocks_) metrics_.SetKv(*blocks_);
  cv_.notify_all();
}

EngineStatus Engine::GetStatus() {
  std::lock_guard<std::mutex> l(mu_);
  EngineStatus r;
  bool stepped = last_ok_step_ != std::chrono::steady_clock::time_point{};
  r.ready = connected_ && stepped;
  for (auto& [id, t] : timing_) {
    auto it = remaining_.find(id);
    if (it != remaining_.end()) r.outstanding_tokens += std::max<int64_t>(0, it->second - t.generated);
  }
  if (scheduler_) {
    r.num_running = static_cast<int32_t>(scheduler_->num_running());
    r.num_waiting = static_cast<int32_t>(scheduler_->num_waiting());
  }
  r.max_model_len = o_.max_model_len;
  r.model = o_.model_name;
  r.vocab_size = o_.config.vocab_size;
  if (blocks_) r.kv_usage = blocks_->Usage();
  const auto [queued_requests, queued_tokens] = Queued();
  r.queue_full = !admission_.HasRoom(queued_requests, queued_tokens);
  r.error = error_;
  return r;
}

bool Engine::WaitReady(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  return cv_.wait_for(l, timeout, [&] {
    return (connected_ && last_ok_step_ != std::chrono::steady_clock::time_point{}) || stop_ || !fatal_.empty();
  }) && connected_ && last_ok_step_ != std::chrono::steady_clock::time_point{};
}

}  // namespace moeshard
