// The Engine against a fake WorkerPool whose "model" continues a sequence by counting: the
// token sampled after a chunk is its last token + 1. The fake checks what a worker relies on
// (steps in step_id order, each sequence's chunks contiguous from position 0, block tables
// covering them) and can hold steps at a gate or fail one, so that the tests see exact token
// sequences, batching, chunked prefill, stops, cancellation and a worker error. A fake that
// follows tokens runs lookahead chunks as one worker with the whole model does (the token it
// drew for the sequence in the step before), and may hold each even step's reply so that the
// step after it answers first.
#include "coordinator/engine.h"

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace moeshard {
namespace {

using std::chrono::milliseconds;

class FakePool final : public WorkerPool {
 public:
  explicit FakePool(bool follows = false, int hold_even_ms = 0) : follows_(follows), hold_even_ms_(hold_even_ms) {}
  int size() const override { return 1; }
  bool FollowsTokens() const override { return follows_; }
  absl::Status Ping(milliseconds) override { return absl::OkStatus(); }
  absl::Status Handshake(const Plan& plan, const HandshakeOptions& o) override {
    std::lock_guard<std::mutex> l(mu_);
    ++handshakes_;
    block_size_ = o.block_size;
    next_step_ = 0;
    next_pos_.clear();
    drawn_.clear();
    return absl::OkStatus();
  }
  absl::StatusOr<StepResult> Step(const StepRequest& r, milliseconds) override {
    std::unique_lock<std::mutex> l(mu_);
    steps_.push_back(r);
    cv_.notify_all();
    cv_.wait(l, [&] { return open_; });
    // Lookahead: two steps may be called at once; they run in step order, as a worker runs them.
    if (follows_) cv_.wait_for(l, std::chrono::seconds(10), [&] { return r.step_id <= next_step_; });
    absl::StatusOr<StepResult> out = Run(r);
    cv_.notify_all();
    if (hold_even_ms_ > 0 && r.step_id % 2 == 0) {
      l.unlock();
      std::this_thread::sleep_for(milliseconds(hold_even_ms_));
    }
    return out;
  }
  absl::StatusOr<StepResult> Run(const StepRequest& r) {
    if (!fail_.empty()) {
      std::string why = fail_;
      fail_.clear();
      return absl::UnavailableError(why);
    }
    if (r.step_id != next_step_++) return absl::InternalError(absl::StrCat("step ", r.step_id, " out of order"));
    StepResult out;
    for (const ChunkPlan& c : r.chunks) {
      const int64_t end = c.start_pos + static_cast<int64_t>(c.tokens.size());
      // A sequence's chunks follow each other (a preempted one restarts at 0).
      if (c.start_pos != 0 && c.start_pos != next_pos_[c.seq_id]) {
        return absl::InternalError(absl::StrCat("seq ", c.seq_id, " chunk at ", c.start_pos, ", expected ", next_pos_[c.seq_id]));
      }
      if (static_cast<int64_t>(c.block_table.size()) * block_size_ < end) {
        return absl::InternalError(absl::StrCat("seq ", c.seq_id, ": block table too short"));
      }
      next_pos_[c.seq_id] = end;
      if (!c.sample) continue;
      int32_t last = c.tokens.back();
      if (c.follow) {
        auto d = drawn_.find(c.seq_id);
        if (!follows_ || d == drawn_.end() || d->second.first != r.step_id - 1) {
          return absl::InternalError(absl::StrCat("seq ", c.seq_id, ": a follow chunk after no draw"));
        }
        last = d->second.second;
        ++num_follows_;
      }
      TokenOutput t;
      t.token_id = last + 1;
      drawn_[c.seq_id] = {r.step_id, t.token_id};
      if (c.logprobs) t.logprob = -0.25f;
      if (c.top_logprobs > 0) t.top = {{t.token_id, -0.25f}};
      out.tokens.emplace_back(c.seq_id, t);
    }
    return out;
  }

  void SetOpen(bool open) {
    std::lock_guard<std::mutex> l(mu_);
    open_ = open;
    cv_.notify_all();
  }
  void FailNextStep(std::string why) {
    std::lock_guard<std::mutex> l(mu_);
    fail_ = std::move(why);
  }
  // Waits until `n` steps arrived (held at the gate or run).
  bool WaitSteps(size_t n) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, std::chrono::seconds(10), [&] { return steps_.size() >= n; });
  }
  std::vector<StepRequest> steps() {
    std::lock_guard<std::mutex> l(mu_);
    return steps_;
  }
  int handshakes() {
    std::lock_guard<std::mutex> l(mu_);
    return handshakes_;
  }
  int num_follows() {
    std::lock_guard<std::mutex> l(mu_);
    return num_follows_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  std::string fail_;
  int handshakes_ = 0;
  int32_t block_size_ = 16;
  int64_t next_step_ = 0;
  std::map<int64_t, int64_t> next_pos_;
  std::vector<StepRequest> steps_;
  const bool follows_;
  const int hold_even_ms_;
  std::map<int64_t, std::pair<int64_t, int32_t>> drawn_;  // seq -> (step, token) of its last draw
  int num_follows_ = 0;
};

struct Outcome {
  std::vector<int32_t> tokens;
  std::string finish_reason, error;
  int32_t cached_tokens = -1;
  std::vector<TokenOutput> outputs;
};

// Reads the stream to its end (or gives up after 10 s).
Outcome Drain(SeqStream& s) {
  Outcome o;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::unique_lock<std::mutex> l(s.mu);
  while (true) {
    s.cv.wait_until(l, until, [&] { return !s.updates.empty() || s.done; });
    while (!s.updates.empty()) {
      const SeqUpdate& u = s.updates.front();
      for (const TokenOutput& t : u.tokens) {
        o.tokens.push_back(t.token_id);
        o.outputs.push_back(t);
      }
      if (u.cached_tokens >= 0) o.cached_tokens = u.cached_tokens;
      if (!u.finish_reason.empty()) {
        o.finish_reason = u.finish_reason;
        o.error = u.error;
      }
      s.updates.pop_front();
    }
    if (s.done || std::chrono::steady_clock::now() >= until) return o;
  }
}

EngineRequest Request(std::vector<int32_t> prompt, int64_t max_tokens) {
  EngineRequest r;
  r.prompt_ids = std::move(prompt);
  r.max_tokens = max_tokens;
  return r;
}

std::vector<int32_t> Range(int32_t first, int32_t n) {
  std::vector<int32_t> v;
  for (int32_t i = 0; i < n; ++i) v.push_back(first + i);
  return v;
}

EngineOptions TestOptions() {
  EngineOptions o;
  o.config.vocab_size = 5000;
  o.config.eos_token_ids = {2000};
  o.plan.num_workers = 1;
  o.num_kv_blocks = 64;
  o.block_size = 4;
  o.max_num_seqs = 4;
  o.max_tokens_per_step = 8;
  o.max_model_len = 100;
  o.prefix_caching = false;
  return o;
}

class EngineTest : public ::testing::Test {
 protected:
  void StartEngine(EngineOptions o = Options(), bool follows = false, int hold_even_ms = 0) {
    auto pool = std::make_unique<FakePool>(follows, hold_even_ms);
    pool_ = pool.get();
    engine_ = std::make_unique<Engine>(std::move(o), std::move(pool));
    engine_->Start();
    ASSERT_TRUE(engine_->WaitReady(std::chrono::seconds(10)));
  }
  static EngineOptions Options() { return TestOptions(); }
  Outcome Run(const EngineRequest& r) {
    auto s = engine_->Submit(r);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? Drain(**s) : Outcome{};
  }
  // The chunks of one sequence over all recorded steps.
  std::vector<ChunkPlan> ChunksOf(int64_t seq_id) {
    std::vector<ChunkPlan> out;
    for (const StepRequest& st : pool_->steps()) {
      for (const ChunkPlan& c : st.chunks) {
        if (c.seq_id == seq_id) out.push_back(c);
      }
    }
    return out;
  }

  FakePool* pool_ = nullptr;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineTest, GeneratesMaxTokensAndReportsLogprobs) {
  StartEngine();
  EngineRequest r = Request({10, 11, 12}, 4);
  r.logprobs = true;
  r.top_logprobs = 1;
  Outcome o = Run(r);
  EXPECT_EQ(o.tokens, std::vector<int32_t>({13, 14, 15, 16}));
  EXPECT_EQ(o.finish_reason, "length");
  EXPECT_EQ(o.cached_tokens, 0);
  ASSERT_EQ(o.outputs.size(), 4u);
  EXPECT_FLOAT_EQ(o.outputs[2].logprob, -0.25f);
  ASSERT_EQ(o.outputs[2].top.size(), 1u);
  EXPECT_EQ(o.outputs[2].top[0].first, 15);
}

TEST_F(EngineTest, StopTokenEosAndContextEnd) {
  StartEngine();
  EngineRequest stop = Request({10, 11, 12}, 10);
  stop.stop_token_ids = {15};
  Outcome o = Run(stop);
  EXPECT_EQ(o.tokens, std::vector<int32_t>({13, 14}));  // the stop token is not output
  EXPECT_EQ(o.finish_reason, "stop");

  o = Run(Request({1997, 1998}, 10));
  EXPECT_EQ(o.tokens, std::vector<int32_t>({1999}));  // 2000 is the model's EOS
  EXPECT_EQ(o.finish_reason, "stop");

  EngineRequest ignore = Request({1997, 1998}, 3);
  ignore.ignore_eos = true;
  o = Run(ignore);
  EXPECT_EQ(o.tokens, std::vector<int32_t>({1999, 2000, 2001}));
  EXPECT_EQ(o.finish_reason, "length");

  o = Run(Request(Range(300, 96), 0));  // max_tokens 0: up to max_model_len (100)
  EXPECT_EQ(o.tokens, std::vector<int32_t>({396, 397, 398, 399}));
  EXPECT_EQ(o.finish_reason, "length");
}

TEST_F(EngineTest, ChunkedPrefillOfALongPrompt) {
  StartEngine();
  auto s = engine_->Submit(Request(Range(100, 20), 2));
  ASSERT_TRUE(s.ok());
  Outcome o = Drain(**s);
  EXPECT_EQ(o.tokens, std::vector<int32_t>({120, 121}));
  EXPECT_EQ(o.finish_reason, "length");
  // max_tokens_per_step 8: the prompt runs as 8 + 8 + 4 tokens, sampling only at its end.
  std::vector<ChunkPlan> chunks = ChunksOf((*s)->seq_id);
  ASSERT_EQ(chunks.size(), 4u);
  const std::vector<int64_t> starts = {0, 8, 16, 20}, sizes = {8, 8, 4, 1};
  const std::vector<bool> samples = {false, false, true, true};
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].start_pos, starts[i]) << i;
    EXPECT_EQ(static_cast<int64_t>(chunks[i].tokens.size()), sizes[i]) << i;
    EXPECT_EQ(chunks[i].sample, samples[i]) << i;
  }
  EXPECT_EQ(chunks[3].tokens, std::vector<int32_t>({120}));  // the decode step feeds the sampled token
}

TEST_F(EngineTest, ContinuousBatchingOfTwoRequests) {
  StartEngine();
  const size_t before = pool_->steps().size();
  pool_->SetOpen(false);
  auto a = engine_->Submit(Request({10, 11, 12}, 5));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(pool_->WaitSteps(before + 1));  // a's prefill is held at the gate
  auto b = engine_->Submit(Request({500, 501}, 3));
  ASSERT_TRUE(b.ok());
  pool_->SetOpen(true);
  Outcome oa = Drain(**a), ob = Drain(**b);
  EXPECT_EQ(oa.tokens, std::vector<int32_t>({13, 14, 15, 16, 17}));
  EXPECT_EQ(ob.tokens, std::vector<int32_t>({502, 503, 504}));
  // The step after a's prefill carries a's first decode and b's prefill together.
  std::vector<StepRequest> steps = pool_->steps();
  ASSERT_GT(steps.size(), before + 1);
  const StepRequest& joint = steps[before + 1];
  ASSERT_EQ(joint.chunks.size(), 2u);
  EXPECT_EQ(joint.chunks[0].seq_id, (*a)->seq_id);
  EXPECT_EQ(joint.chunks[0].tokens, std::vector<int32_t>({13}));
  EXPECT_EQ(joint.chunks[1].seq_id, (*b)->seq_id);
  EXPECT_EQ(joint.chunks[1].tokens, std::vector<int32_t>({500, 501}));
}

TEST_F(EngineTest, AdmissionRefusesAFullQueueAndBadRequests) {
  EngineOptions o = Options();
  o.admission.max_queued_requests = 1;
  StartEngine(o);
  EXPECT_EQ(engine_->Submit(Request({}, 1)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->Submit(Request({5000}, 1)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->Submit(Request(Range(1, 100), 1)).status().code(), absl::StatusCode::kInvalidArgument);
  EngineRequest hot = Request({1}, 1);
  hot.sampling.top_p = 0;
  EXPECT_EQ(engine_->Submit(hot).status().code(), absl::StatusCode::kInvalidArgument);

  const size_t before = pool_->steps().size();
  pool_->SetOpen(false);
  auto a = engine_->Submit(Request({10}, 2));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(pool_->WaitSteps(before + 1));  // a runs (held); the queue is empty
  auto b = engine_->Submit(Request({20}, 2));  // queued behind the step in flight
  ASSERT_TRUE(b.ok());
  auto c = engine_->Submit(Request({30}, 2));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(engine_->GetStatus().queue_full);
  pool_->SetOpen(true);
  EXPECT_EQ(Drain(**a).tokens, std::vector<int32_t>({11, 12}));
  EXPECT_EQ(Drain(**b).tokens, std::vector<int32_t>({21, 22}));
}

TEST_F(EngineTest, CancelFreesTheSequence) {
  StartEngine();
  const size_t before = pool_->steps().size();
  pool_->SetOpen(false);
  auto a = engine_->Submit(Request({10, 11}, 50));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(pool_->WaitSteps(before + 1));
  engine_->Cancel((*a)->seq_id);
  Outcome oa = Drain(**a);
  EXPECT_TRUE(oa.tokens.empty());
  EXPECT_EQ(oa.finish_reason, "");  // cancelled: done without a finish update
  pool_->SetOpen(true);
  // The engine goes on, and tells the workers the cancelled sequence is gone.
  Outcome ob = Run(Request({40}, 2));
  EXPECT_EQ(ob.tokens, std::vector<int32_t>({41, 42}));
  bool released = false;
  for (const StepRequest& st : pool_->steps()) {
    for (int64_t id : st.released_seqs) released |= id == (*a)->seq_id;
  }
  EXPECT_TRUE(released);
  EXPECT_EQ(ChunksOf((*a)->seq_id).size(), 1u);  // only the step already in flight
  EXPECT_EQ(engine_->GetStatus().num_running, 0);
}

TEST_F(EngineTest, WorkerErrorIsTheRequestsError) {
  StartEngine();
  pool_->FailNextStep("worker 0 (fake): out of memory");
  Outcome o = Run(Request({10, 11}, 3));
  EXPECT_TRUE(o.tokens.empty());
  EXPECT_EQ(o.finish_reason, "abort");
  EXPECT_EQ(o.error, "worker 0 (fake): out of memory");
  // The engine re-forms the group (a new handshake) and serves again.
  ASSERT_TRUE(engine_->WaitReady(std::chrono::seconds(10)));
  EXPECT_GE(pool_->handshakes(), 2);
  EXPECT_EQ(Run(Request({10, 11}, 3)).tokens, std::vector<int32_t>({12, 13, 14}));
}

// Lookahead: the decode step after each sampled one is sent while it runs; the fake answers each
// even step 5 ms late, so the step after it answers first and the engine must apply them in order.
TEST_F(EngineTest, LookaheadKeepsEveryTokenStopAndCancel) {
  StartEngine(Options(), /*follows=*/true, /*hold_even_ms=*/5);
  auto a = engine_->Submit(Request({10, 11, 12}, 12));
  EngineRequest stop = Request({500, 501}, 20);
  stop.stop_token_ids = {507};
  auto b = engine_->Submit(stop);
  EngineRequest eos = Request({1995}, 20);  // 2000 is the model's EOS
  auto c = engine_->Submit(eos);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(Drain(**a).tokens, Range(13, 12));
  Outcome ob = Drain(**b), oc = Drain(**c);
  EXPECT_EQ(ob.tokens, Range(502, 5));  // through 506: 507 stops, and the lookahead after it is dropped
  EXPECT_EQ(ob.finish_reason, "stop");
  EXPECT_EQ(oc.tokens, Range(1996, 4));
  EXPECT_EQ(oc.finish_reason, "stop");
  EXPECT_GT(pool_->num_follows(), 10);
  // Steps overlapped: some step was sent before the one before it had answered, and a
  // sequence's lookahead chunk follows its sampled chunk in the very next step.
  bool followed = false;
  std::map<int64_t, StepRequest> by_id;  // (two steps in flight may reach the fake in either order)
  for (const StepRequest& st : pool_->steps()) by_id[st.step_id] = st;
  for (const auto& [id, st] : by_id) {
    for (const ChunkPlan& ch : st.chunks) {
      if (!ch.follow) continue;
      followed = true;
      EXPECT_EQ(ch.tokens, std::vector<int32_t>({-1}));
      bool before = false;
      auto prev = by_id.find(id - 1);
      for (const ChunkPlan& p : prev != by_id.end() ? prev->second.chunks : std::vector<ChunkPlan>{}) {
        before |= p.seq_id == ch.seq_id && p.sample;
      }
      EXPECT_TRUE(before) << "step " << id << " seq " << ch.seq_id;
    }
  }
  EXPECT_TRUE(followed);
  // Cancelled while a step and its lookahead are in flight: no update after, the engine goes on.
  auto d = engine_->Submit(Request({100}, 1000 - 200));
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(pool_->WaitSteps(pool_->steps().size() + 4));
  engine_->Cancel((*d)->seq_id);
  Outcome od = Drain(**d);
  EXPECT_EQ(od.finish_reason, "");
  for (size_t i = 0; i < od.tokens.size(); ++i) EXPECT_EQ(od.tokens[i], 101 + static_cast<int32_t>(i));
  EXPECT_EQ(Run(Request({40}, 6)).tokens, Range(41, 6));
  EXPECT_EQ(engine_->GetStatus().num_running, 0);
  EXPECT_EQ(pool_->handshakes(), 1);  // no step failed
}

// Without lookahead (the option off) nothing is sent ahead, on the same fake.
TEST_F(EngineTest, LookaheadOff) {
  EngineOptions o = Options();
  o.lookahead = false;
  StartEngine(o, /*follows=*/true);
  EXPECT_EQ(Run(Request({10, 11, 12}, 8)).tokens, Range(13, 8));
  EXPECT_EQ(pool_->num_follows(), 0);
}

TEST(EngineNotStarted, SubmitIsUnavailable) {
  Engine engine(TestOptions(), std::make_unique<FakePool>());
  EXPECT_EQ(engine.Submit(Request({1}, 1)).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace moeshard
