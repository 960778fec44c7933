#include "coordinator/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace moeshard {
namespace {

bool Contains(const std::vector<int32_t>& v, int32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

absl::Status SchedulerConfig::Validate() const {
  if (max_num_seqs < 1) return absl::InvalidArgumentError(absl::StrCat("max_num_seqs must be >= 1, got ", max_num_seqs));
  if (max_tokens_per_step < max_num_seqs) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens_per_step (", max_tokens_per_step,
                                                   ") must be >= max_num_seqs (", max_num_seqs, ")"));
  }
  if (max_model_len < 1) return absl::InvalidArgumentError(absl::StrCat("max_model_len must be >= 1, got ", max_model_len));
  return absl::OkStatus();
}

int64_t StepPlan::num_tokens() const {
  int64_t n = 0;
  for (const ChunkPlan& c : chunks) n += static_cast<int64_t>(c.tokens.size());
  return n;
}

Scheduler::Scheduler(SchedulerConfig config, BlockManager* blocks)
    : config_(config), config_status_(config.Validate()), blocks_(blocks) {
  if (blocks_ == nullptr) {
    config_status_ = absl::InvalidArgumentError("scheduler needs a block manager");
  } else if (config_status_.ok() && blocks_->has_sliding_pool()) {
    // One sequence alone must always fit a full step: its window plus a chunk of the budget.
    const int64_t bs = blocks_->block_size();
    const int64_t need = (blocks_->sliding_window() - 1 + config.max_tokens_per_step + bs - 1) / bs + 1;
    if (blocks_->Stats(KvKind::kSliding).total < need) {
      config_status_ = absl::InvalidArgumentError(absl::StrCat(
          "the sliding KV pool has ", blocks_->Stats(KvKind::kSliding).total, " blocks; a step of ",
          config.max_tokens_per_step, " tokens over a window of ", blocks_->sliding_window(), " needs ", need));
    }
  }
}

absl::Status Scheduler::Add(SeqRequest request) {
  RETURN_IF_ERROR(config_status_);
  const int64_t id = request.seq_id;
  const int64_t len = static_cast<int64_t>(request.prompt.size());
  if (seqs_.count(id)) return absl::AlreadyExistsError(absl::StrCat("sequence ", id, " is already queued"));
  if (len == 0) return absl::InvalidArgumentError(absl::StrCat("sequence ", id, " has an empty prompt"));
  if (request.max_new_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", id, ": max_new_tokens must be >= 1, got ",
                                                   request.max_new_tokens));
  }
  if (request.top_logprobs < 0) return absl::InvalidArgumentError(absl::StrCat("sequence ", id, ": top_logprobs < 0"));
  RETURN_IF_ERROR(request.sampling.Validate());
  if (len > config_.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", id, ": prompt of ", len,
                                                   " tokens is longer than max_model_len ", config_.max_model_len));
  }
  const int64_t bs = blocks_->block_size();
  if ((len + bs - 1) / bs > blocks_->num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", id, ": prompt of ", len, " tokens needs more than the ",
                                                   blocks_->num_blocks(), " KV blocks of ", bs, " tokens"));
  }
  Seq seq;
  seq.tokens = request.prompt;
  seq.req = std::move(request);
  seqs_.emplace(id, std::move(seq));
  waiting_.push_back(id);
  return absl::OkStatus();
}

void Scheduler::Abort(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  pending_events_.erase(std::remove_if(pending_events_.begin(), pending_events_.end(),
                                       [&](const SeqEvent& e) { return e.seq_id == seq_id; }),
                        pending_events_.end());
  if (it->second.in_flight > 0) {
    it->second.aborted = true;
  } else {
    Finish(seq_id);
  }
}

ChunkPlan Scheduler::MakeChunk(Seq& seq, int64_t n) {
  ChunkPlan c;
  c.seq_id = seq.req.seq_id;
  c.start_pos = seq.num_computed;
  c.tokens.assign(seq.tokens.begin() + seq.num_computed, seq.tokens.begin() + seq.num_computed + n);
  c.block_table = blocks_->BlockTable(c.seq_id);
  c.sliding_table = blocks_->SlidingTable(c.seq_id);
  c.sample = seq.num_computed + n == static_cast<int64_t>(seq.tokens.size());
  c.sampling = seq.req.sampling;
  c.logprobs = seq.req.logprobs;
  c.top_logprobs = seq.req.top_logprobs;
  ++seq.in_flight;
  seq.samples_in_flight = c.sample;
  return c;
}

bool Scheduler::CanLookAhead(const Seq& s) const {
  if (!s.running || s.aborted || s.in_flight != 1 || !s.samples_in_flight) return false;
  const int64_t total = static_cast<int64_t>(s.tokens.size()) + 1;  // with the token in flight
  const int64_t bs = blocks_->block_size();
  return s.num_generated() + 1 < s.req.max_new_tokens && total < config_.max_model_len &&
         (total + bs - 1) / bs <= blocks_->num_blocks();
}

std::optional<StepPlan> Scheduler::Schedule(bool lookahead) {
  if (!config_status_.ok()) return std::nullopt;
  StepPlan step;
  int64_t budget = config_.max_tokens_per_step;
  std::unordered_set<int64_t> in_step;
  bool short_of_blocks = false;
  const int64_t preemptions_before = num_preemptions_;
  const std::vector<int64_t> running = running_;  // preemption edits running_ while we walk

  // 1. Decodes: one pending token.
  for (int64_t id : running) {
    if (budget == 0) break;
    Seq& s = seqs_.at(id);
    const int64_t total = static_cast<int64_t>(s.tokens.size());
    if (lookahead && CanLookAhead(s)) {  // the token at `total` is being sampled
      // No sliding block is released (Append from the in-flight chunk's start): the in-flight
      // chunk's blocks are registered in the prefix cache with their sliding blocks only when it
      // completes (MarkComputed), and its last position may run again if its token does not
      // come. The next plan after it releases them.
      if (!blocks_->CanAppend(id, s.num_computed, total + 1) || !blocks_->Append(id, s.num_computed, total + 1).ok()) {
        continue;
      }
      ChunkPlan c = MakeChunk(s, 0);
      c.start_pos = total;
      c.tokens = {-1};
      c.follow = true;
      c.sample = true;
      s.samples_in_flight = true;
      step.chunks.push_back(std::move(c));
      in_step.insert(id);
      --budget;
      continue;
    }
    if (!s.running || s.in_flight > 0 || total - s.num_computed != 1) continue;
    while (!blocks_->CanAppend(id, s.num_computed, total)) {
      if (!PreemptFor(id, in_step, &step)) break;
    }
    if (!blocks_->Append(id, s.num_computed, total).ok()) {  // wait for in-flight steps to release blocks
      short_of_blocks = true;
      continue;
    }
    step.chunks.push_back(MakeChunk(s, 1));
    in_step.insert(id);
    --budget;
  }
  // 2. Running sequences part-way through their prompt (their blocks were reserved at admission).
  for (int64_t id : running) {
    if (budget == 0) break;
    auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;
    Seq& s = it->second;
    const int64_t pending = static_cast<int64_t>(s.tokens.size()) - s.num_computed;
    if (!s.running || s.in_flight > 0 || in_step.count(id) || pending <= 1) continue;
    // Full blocks were reserved at admission; sliding-pool blocks come chunk by chunk. When they
    // are short, a smaller chunk, then the newest preemptible sequence's blocks (as for decodes).
    int64_t n = std::min(pending, budget);
    while (n > 1 && !blocks_->CanAppend(id, s.num_computed, s.num_computed + n)) n = (n + 1) / 2;
    while (!blocks_->CanAppend(id, s.num_computed, s.num_computed + n)) {
      if (!PreemptFor(id, in_step, &step)) break;
    }
    if (!blocks_->Append(id, s.num_computed, s.num_computed + n).ok()) {
      short_of_blocks = true;
      continue;
    }
    step.chunks.push_back(MakeChunk(s, n));
    in_step.insert(id);
    budget -= n;
  }
  // 3. Admit waiting sequences in order, unless this step is already short of blocks.
  while (!short_of_blocks && num_preemptions_ == preemptions_before && budget > 0 && !waiting_.empty() &&
         num_running() < config_.max_num_seqs) {
    const int64_t id = waiting_.front();
    Seq& s = seqs_.at(id);
    if (!blocks_->CanAllocate(s.tokens, budget)) break;
    absl::StatusOr<int64_t> cached = blocks_->Allocate(id, s.tokens, budget);  // sliding blocks for the first chunk
    if (!cached.ok()) break;
    waiting_.pop_front();
    running_.push_back(id);
    s.running = true;
    s.num_computed = *cached;
    if (!s.scheduled_once) {
      s.scheduled_once = true;
      s.cached_to_report = *cached;
    }
    const int64_t n = std::min(static_cast<int64_t>(s.tokens.size()) - s.num_computed, budget);
    step.chunks.push_back(MakeChunk(s, n));
    step.chunks.back().cached_prefix.assign(s.tokens.begin(), s.tokens.begin() + s.num_computed);
    in_step.insert(id);
    budget -= n;
  }
  if (step.chunks.empty()) return std::nullopt;
  step.step_id = next_step_id_++;
  in_flight_steps_.insert(step.step_id);
  return step;
}

bool Scheduler::PreemptFor(int64_t seq_id, const std::unordered_set<int64_t>& in_step, StepPlan* step) {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    const int64_t v = *it;
    if (v == seq_id || in_step.count(v) || seqs_.at(v).in_flight > 0) continue;
    Preempt(v, step);
    return true;
  }
  return false;
}

void Scheduler::Preempt(int64_t seq_id, StepPlan* step) {
  Seq& s = seqs_.at(seq_id);
  blocks_->Free(seq_id);
  s.running = false;
  s.num_computed = 0;
  running_.erase(std::find(running_.begin(), running_.end(), seq_id));
  waiting_.push_front(seq_id);
  ++num_preemptions_;
  step->preempted.push_back(seq_id);
  SeqEvent ev;
  ev.seq_id = seq_id;
  ev.preempted = true;
  pending_events_.push_back(std::move(ev));
}

void Scheduler::Finish(int64_t seq_id) {
  blocks_->Free(seq_id);
  auto r = std::find(running_.begin(), running_.end(), seq_id);
  if (r != running_.end()) running_.erase(r);
  auto w = std::find(waiting_.begin(), waiting_.end(), seq_id);
  if (w != waiting_.end()) waiting_.erase(w);
  seqs_.erase(seq_id);
}

bool Scheduler::IsStop(const Seq& seq, int32_t token, bool* is_stop_token) const {
  *is_stop_token = Contains(seq.req.stop_token_ids, token) ||
                   (!seq.req.ignore_eos && Contains(seq.req.eos_token_ids, token));
  return *is_stop_token;
}

std::vector<SeqEvent> Scheduler::OnStepDone(const StepPlan& step,
                                            const std::vector<std::pair<int64_t, int32_t>>& sampled) {
  std::vector<SeqEvent> events = std::move(pending_events_);
  pending_events_.clear();
  if (!in_flight_steps_.erase(step.step_id)) return events;
  const std::unordered_map<int64_t, int32_t> token_of(sampled.begin(), sampled.end());
  for (const ChunkPlan& chunk : step.chunks) {
    auto it = seqs_.find(chunk.seq_id);
    if (it == seqs_.end()) continue;
    Seq& s = it->second;
    if (--s.in_flight == 0) s.samples_in_flight = false;
    if (s.aborted) {
      Finish(chunk.seq_id);
      continue;
    }
    if (chunk.start_pos != s.num_computed) continue;  // a lookahead whose token did not come
    SeqEvent ev;
    ev.seq_id = chunk.seq_id;
    bool report = false;
    if (s.cached_to_report >= 0) {
      ev.num_cached_tokens = s.cached_to_report;
      s.cached_to_report = -1;
      report = true;
    }
    auto tok = token_of.find(chunk.seq_id);
    const bool got_token = chunk.sample && tok != token_of.end();
    // Without its token, a sampled chunk's last position runs again (rewriting the same KV), and
    // a lookahead in flight behind it is void: nothing may follow that one.
    if (chunk.sample && !got_token && s.in_flight > 0) s.samples_in_flight = false;
    s.num_computed += static_cast<int64_t>(chunk.tokens.size()) - (chunk.sample && !got_token ? 1 : 0);
    blocks_->MarkComputed(chunk.seq_id, s.tokens, s.num_computed);
    if (got_token) {
      s.tokens.push_back(tok->second);
      ev.token = tok->second;
      report = true;
      const int64_t total = static_cast<int64_t>(s.tokens.size());
      const int64_t bs = blocks_->block_size();
      if (IsStop(s, tok->second, &ev.is_stop_token)) {
        ev.finished = true;
        ev.finish_reason = "stop";
      } else if (s.num_generated() >= s.req.max_new_tokens || total >= config_.max_model_len ||
                 (total + bs - 1) / bs > blocks_->num_blocks()) {  // the pool cannot hold one more position
        ev.finished = true;
        ev.finish_reason = "length";
      }
    }
    if (report) events.push_back(ev);
    if (ev.finished) Finish(chunk.seq_id);
  }
  return events;
}

absl::Status Scheduler::CheckIntegrity() const {
  auto bad = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  if (static_cast<int64_t>(running_.size() + waiting_.size()) != static_cast<int64_t>(seqs_.size())) {
    return bad(seqs_.size(), " sequences but ", running_.size(), " running and ", waiting_.size(), " waiting");
  }
  if (num_running() > config_.max_num_seqs) return bad(num_running(), " running > max_num_seqs");
  std::unordered_set<int64_t> seen;
  int64_t num_in_flight = 0;
  for (int64_t id : running_) {
    auto it = seqs_.find(id);
    if (it == seqs_.end() || !seen.insert(id).second || !it->second.running) return bad("running entry ", id, " is stale");
    const Seq& s = it->second;
    const int64_t capacity = static_cast<int64_t>(blocks_->BlockTable(id).size()) * blocks_->block_size();
    const int64_t total = static_cast<int64_t>(s.tokens.size());
    if (!blocks_->Has(id) || capacity < std::max(s.num_computed, total - 1)) return bad("sequence ", id, " lacks blocks");
    if (s.num_computed >= total) return bad("sequence ", id, " has no pending token");
    if (s.aborted && s.in_flight == 0) return bad("aborted sequence ", id, " is still held");
    if (s.in_flight < 0 || s.in_flight > 2) return bad("sequence ", id, " is in ", s.in_flight, " steps");
    num_in_flight += s.in_flight > 0;
  }
  for (int64_t id : waiting_) {
    auto it = seqs_.find(id);
    if (it == seqs_.end() || !seen.insert(id).second || it->second.running) return bad("waiting entry ", id, " is stale");
    const Seq& s = it->second;
    if (blocks_->Has(id) || s.num_computed != 0 || s.in_flight > 0) return bad("waiting sequence ", id, " holds state");
  }
  // (A step may be left with no live sequence: one that finished or was aborted while its
  // lookahead was in flight.)
  if (num_in_flight > 0 && in_flight_steps_.empty()) {
    return bad(num_in_flight, " sequences in flight but no step");
  }
  return blocks_->CheckIntegrity();
}

}  // namespace moeshard
