#include "router/generation.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "router/api_error.h"
#include "common/tokenizer/detokenizer.h"
#include "proto/proto_convert.h"
#include "router/log.h"

namespace moeshard::router {

// ---------------------------------------------------------------- ActiveGenerations

void ActiveGenerations::Add(Generation* g) {
  std::lock_guard<std::mutex> lock(mu_);
  active_.insert(g);
}

void ActiveGenerations::Remove(Generation* g) {
  std::lock_guard<std::mutex> lock(mu_);
  active_.erase(g);
}

size_t ActiveGenerations::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_.size();
}

void ActiveGenerations::CancelAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Generation* g : active_) g->Cancel();
}

// ---------------------------------------------------------------- Generation

namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string RejectReason(const absl::Status& st) {
  if (ErrorCode(st) == "context_length_exceeded") return "context_length";
  if (absl::IsUnavailable(st)) return "no_ready_pool";
  return "bad_request";
}

// Failures that another coordinator may not have: worth a retry when nothing was sent yet.
bool IsRetryable(const absl::Status& st) {
  switch (st.code()) {
    case absl::StatusCode::kOk:  // an abort, or a stream without a finish reason
    case absl::StatusCode::kCancelled:  // the coordinator shut down (this router's own cancel returns earlier)
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kResourceExhausted:
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Generation>> Generation::Start(const RouterServices& services, PreparedRequest request) {
  if (services.shutting_down != nullptr && services.shutting_down->load()) {
    services.metrics->RequestRejected(kNoPool, "shutting_down");
    return absl::UnavailableError("the router is shutting down");
  }
  const int64_t prompt_tokens = static_cast<int64_t>(request.prompt_ids.size());
  auto lease = services.cluster->Acquire(prompt_tokens, request.params.max_tokens);
  const auto heal_deadline = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(services.heal_wait);
  while (!lease.ok() && absl::IsUnavailable(lease.status()) && services.cluster->EverReady() &&
         std::chrono::steady_clock::now() < heal_deadline &&
         (services.shutting_down == nullptr || !services.shutting_down->load())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    lease = services.cluster->Acquire(prompt_tokens, request.params.max_tokens);
  }
  if (!lease.ok()) {
    services.metrics->RequestRejected(kNoPool, RejectReason(lease.status()));
    LogLine(request.request_id, absl::StrCat("rejected: ", lease.status().message()));
    return lease.status();
  }
  return std::unique_ptr<Generation>(new Generation(services, std::move(request), *std::move(lease)));
}

Generation::Generation(const RouterServices& services, PreparedRequest request, Lease lease)
    : services_(services),
      request_(std::move(request)),
      lease_(std::move(lease)),
      start_(std::chrono::steady_clock::now()) {
  services_.metrics->RequestDispatched(lease_.pool());
  services_.metrics->InFlightAdd(lease_.pool(), 1);
  services_.active->Add(this);
  LogLine(request_.request_id,
          absl::StrCat("dispatched to pool ", lease_.pool(), " coordinator ", lease_.client()->address(),
                       ": prompt_tokens=", request_.prompt_ids.size(), " max_tokens=", lease_.max_tokens()));
}

Generation::~Generation() {
  services_.active->Remove(this);
  services_.metrics->InFlightAdd(lease_.pool(), -1);
}

void Generation::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  if (call_ != nullptr) call_->Cancel();
}

v1::SeqRequest Generation::MakeSeqRequest() const {
  const GenerationParams& p = request_.params;
  v1::SeqRequest r;
  // A migrated request resumes: its prompt is the original one plus the tokens streamed.
  r.mutable_prompt_ids()->Assign(request_.prompt_ids.begin(), request_.prompt_ids.end());
  r.mutable_prompt_ids()->Add(generated_.begin(), generated_.end());
  r.set_max_tokens(static_cast<int32_t>(lease_.max_tokens() - static_cast<int64_t>(generated_.size())));
  SamplingToProto(p.sampling, r.mutable_sampling());
  r.mutable_stop_token_ids()->Assign(p.stop_token_ids.begin(), p.stop_token_ids.end());
  r.set_ignore_eos(p.ignore_eos);
  r.set_logprobs(p.logprobs);
  r.set_top_logprobs(p.top_logprobs);
  r.set_request_id(request_.request_id);
  return r;
}

absl::StatusOr<GenerationResult> Generation::Run(const DeltaCallback& on_delta) {
  const GenerationParams& p = request_.params;
  IncrementalDetokenizer::Options opts{
      .stop = p.stop, .hidden_ids = p.stop_token_ids, .skip_special_tokens = p.skip_special_tokens};
  if (!p.ignore_eos) opts.hidden_ids.insert(opts.hidden_ids.end(), services_.eos_ids.begin(), services_.eos_ids.end());
  IncrementalDetokenizer detok(services_.tokenizer, std::move(opts));

  GenerationResult result;
  result.prompt_tokens = prompt_tokens();
  std::vector<std::string> failed;  // coordinators that failed this request
  std::vector<std::string> full;    // coordinators that refused it with a full queue
  for (int attempt = 1;; ++attempt) {
    GenerateCall call(lease_.client(), MakeSeqRequest());
    {
      std::lock_guard<std::mutex> lock(mu_);
      call_ = &call;
      if (cancelled_) call.Cancel();
    }
    bool finished = false, client_gone = false;
    int32_t last_token = -1;
    v1::SeqUpdate update;
    while (!finished && call.Read(&update)) {
      if (generated_.empty()) result.cached_tokens = std::max<int64_t>(result.cached_tokens, update.cached_tokens());
      GenerationDelta delta;
      for (const v1::TokenOutput& t : update.tokens()) {
        if (result.completion_tokens >= lease_.max_tokens()) break;  // a coordinator that overshoots
        if (result.completion_tokens == 0) services_.metrics->FirstToken(lease_.pool(), SecondsSince(start_));
        ++result.completion_tokens;
        generated_.push_back(t.token_id());
        last_token = t.token_id();
        TokenInfo info{.id = t.token_id(), .logprob = t.logprob(), .top = {}};
        for (const v1::TopLogprob& top : t.top()) info.top.emplace_back(top.token_id(), top.logprob());
        delta.tokens.push_back(std::move(info));
        delta.text += detok.Add(t.token_id());
        if (detok.stopped()) break;
      }
      lease_.TokensDone(static_cast<int64_t>(delta.tokens.size()));
      if (detok.stopped()) {
        result.finish_reason = "stop";
        result.stop_string = detok.matched_stop();
      } else if (!update.finish_reason().empty()) {
        result.finish_reason = update.finish_reason();
      } else if (result.completion_tokens >= lease_.max_tokens()) {
        result.finish_reason = "length";
      }
      finished = !result.finish_reason.empty();
      if (finished) delta.text += detok.Flush();
      if ((!delta.tokens.empty() || !delta.text.empty()) && !on_delta(delta)) {
        client_gone = true;
        break;
      }
    }
    if (finished || client_gone) call.Cancel();  // frees the sequence now, if it still runs
    absl::Status st = call.Finish();
    {
      std::lock_guard<std::mutex> lock(mu_);
      call_ = nullptr;
    }
    const std::string address = lease_.client()->address();
    if (client_gone) {
      LogLine(request_.request_id,
              absl::StrCat("client went away after ", result.completion_tokens, " tokens: cancelled"));
      return absl::CancelledError("the client went away");
    }
    if (finished && result.finish_reason != "abort") {
      if (result.finish_reason == "stop" && !result.stop_string && last_token >= 0 &&
          std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), last_token) != p.stop_token_ids.end()) {
        result.stop_token_id = last_token;
      }
      const double seconds = SecondsSince(start_);
      services_.metrics->RequestFinished(lease_.pool(), result.finish_reason, seconds, result.prompt_tokens,
                                         result.completion_tokens);
      LogLine(request_.request_id, absl::StrCat("finished (", result.finish_reason, "): prompt_tokens=",
                                                result.prompt_tokens, " completion_tokens=", result.completion_tokens,
                                                " cached_tokens=", result.cached_tokens, " seconds=", seconds));
      return result;
    }
    if (cancelled()) return absl::UnavailableError("the router is shutting down");
    const bool delivered = result.completion_tokens > 0;
    if (!delivered && failed.empty() && !IsRetryable(st)) {
      LogLine(request_.request_id, absl::StrCat("coordinator ", address, " refused the request: ", st.message()));
      return st;
    }
    // A full queue on the first attempt: another coordinator with room, or 503 at once.
    const bool queue_full = absl::IsResourceExhausted(st) && !delivered && failed.empty();
    const std::string why = finished
                                ? "aborted the request"
                                : (st.ok() ? "ended the stream without a finish reason" : std::string(st.message()));
    LogLine(request_.request_id, absl::StrCat("coordinator ", address, " failed (attempt ", attempt, ", ",
                                              result.completion_tokens, " tokens streamed): ", why));
    services_.metrics->RequestRejected(lease_.pool(), queue_full ? "queue_full" : "coordinator_error");
    if (attempt >= kMaxAttempts) {
      return absl::UnavailableError(absl::StrCat("coordinator ", address, " ", why, " (", attempt, " attempts)"));
    }
    result.finish_reason.clear();  // an "abort" is not the request's end
    if (queue_full) {
      full.push_back(address);
    } else {
      lease_.MarkFailed(why);
      failed.push_back(address);
    }
    if (absl::Status m = Migrate(queue_full ? full : failed, /*wait=*/!queue_full); !m.ok()) {
      return absl::UnavailableError(absl::StrCat("coordinator ", address, " ", why, "; ", m.message()));
    }
    LogLine(request_.request_id, absl::StrCat(delivered ? "migrating" : "retrying", " on pool ", lease_.pool(),
                                              " coordinator ", lease_.client()->address(), " with ",
                                              generated_.size(), " tokens already streamed"));
  }
}

bool Generation::cancelled() {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

absl::Status Generation::Migrate(const std::vector<std::string>& failed, bool wait) {
  const auto deadline = start_ + absl::ToChronoMilliseconds(services_.migration_timeout);
  const std::optional<int64_t> max_tokens = request_.params.max_tokens;
  for (;;) {
    auto next = services_.cluster->Acquire(prompt_tokens(), max_tokens, failed);
    // The coordinator that failed may be the only one: it takes the request once its group healed.
    if (!next.ok() && wait) next = services_.cluster->Acquire(prompt_tokens(), max_tokens);
    if (next.ok()) {
      services_.metrics->InFlightAdd(lease_.pool(), -1);
      lease_ = *std::move(next);
      services_.metrics->InFlightAdd(lease_.pool(), 1);
      return absl::OkStatus();
    }
    if (!wait) return next.status();
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::UnavailableError(absl::StrCat("no coordinator became ready within ",
                                                 absl::FormatDuration(services_.migration_timeout), ": ",
                                                 next.status().message()));
    }
    if (cancelled()) return absl::UnavailableError("the router is shutting down");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace moeshard::router
