#include "coordinator/scheduler.h"

#include <deque>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moeshard {
namespace {

constexpr int32_t kEos = 2;

SeqRequest Req(int64_t id, int64_t prompt_len, int64_t max_new, int32_t first_token = 100) {
  SeqRequest r;
  r.seq_id = id;
  r.prompt.resize(prompt_len);
  std::iota(r.prompt.begin(), r.prompt.end(), first_token);
  r.max_new_tokens = max_new;
  r.eos_token_ids = {kEos};
  return r;
}

// The token a sequence samples at a position: independent of batching, as seeded sampling is.
int32_t FakeToken(int64_t seq_id, int64_t pos) { return static_cast<int32_t>(1000 + (seq_id * 131 + pos * 7) % 997); }

std::vector<std::pair<int64_t, int32_t>> Sample(const StepPlan& step) {
  std::vector<std::pair<int64_t, int32_t>> out;
  for (const ChunkPlan& c : step.chunks) {
    if (c.sample) out.push_back({c.seq_id, FakeToken(c.seq_id, c.start_pos + c.tokens.size())});
  }
  return out;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::string finish_reason;
  int64_t num_cached = -1;
  int64_t num_preempted = 0;
};

// Runs steps one at a time to completion; returns what each sequence produced.
std::map<int64_t, Outcome> RunAll(Scheduler& s, std::vector<StepPlan>* steps = nullptr) {
  std::map<int64_t, Outcome> out;
  for (int guard = 0; s.HasWork() && guard < 10000; ++guard) {
    std::optional<StepPlan> step = s.Schedule();
    EXPECT_TRUE(step.has_value()) << "stalled with work left";
    if (!step) break;
    if (steps) steps->push_back(*step);
    for (const SeqEvent& e : s.OnStepDone(*step, Sample(*step))) {
      Outcome& o = out[e.seq_id];
      if (e.token) o.tokens.push_back(*e.token);
      if (e.finished) o.finish_reason = e.finish_reason;
      if (e.num_cached_tokens >= 0) o.num_cached = e.num_cached_tokens;
      o.num_preempted += e.preempted;
    }
    EXPECT_TRUE(s.CheckIntegrity().ok()) << s.CheckIntegrity();
  }
  return out;
}

TEST(SchedulerTest, BudgetAndChunkedPrefill) {
  BlockManager bm(100, 4, false);
  Scheduler s({.max_num_seqs = 4, .max_tokens_per_step = 16, .max_model_len = 128}, &bm);
  ASSERT_TRUE(s.Add(Req(1, 40, 2)).ok());
  ASSERT_TRUE(s.Add(Req(2, 10, 2, 500)).ok());
  ASSERT_TRUE(s.Add(Req(3, 5, 2)).ok());
  std::vector<StepPlan> steps;
  std::map<int64_t, Outcome> out = RunAll(s, &steps);
  ASSERT_GE(steps.size(), 4u);
  auto summary = [](const StepPlan& p) {
    std::vector<std::tuple<int64_t, int64_t, size_t, bool>> v;
    for (const ChunkPlan& c : p.chunks) v.emplace_back(c.seq_id, c.start_pos, c.tokens.size(), c.sample);
    return v;
  };
  using T = std::tuple<int64_t, int64_t, size_t, bool>;
  EXPECT_THAT(summary(steps[0]), ::testing::ElementsAre(T{1, 0, 16, false}));
  EXPECT_THAT(summary(steps[1]), ::testing::ElementsAre(T{1, 16, 16, false}));
  EXPECT_THAT(summary(steps[2]), ::testing::ElementsAre(T{1, 32, 8, true}, T{2, 0, 8, false}));
  // Decode first, then the rest of 2's prompt, then 3 is admitted.
  EXPECT_THAT(summary(steps[3]), ::testing::ElementsAre(T{1, 40, 1, true}, T{2, 8, 2, true}, T{3, 0, 5, true}));
  std::map<int64_t, int64_t> next_pos;
  for (const StepPlan& p : steps) {
    EXPECT_LE(p.num_tokens(), 16);
    for (const ChunkPlan& c : p.chunks) {
      EXPECT_EQ(c.start_pos, next_pos[c.seq_id]) << "seq " << c.seq_id;
      next_pos[c.seq_id] = c.start_pos + c.tokens.size();
      EXPECT_GE(static_cast<int64_t>(c.block_table.size()) * 4, next_pos[c.seq_id]);
    }
  }
  EXPECT_EQ(steps[2].chunks[1].tokens.front(), 500);  // the prompt's own tokens
  for (int64_t id : {1, 2, 3}) {
    EXPECT_EQ(out[id].tokens.size(), 2u);
    EXPECT_EQ(out[id].finish_reason, "length");
  }
  EXPECT_EQ(bm.num_free_blocks(), 100);
}

TEST(SchedulerTest, DecodeBatching) {
  BlockManager bm(100, 4, true);
  Scheduler s({.max_num_seqs = 8, .max_tokens_per_step = 64, .max_model_len = 128}, &bm);
  for (int64_t id = 1; id <= 4; ++id) ASSERT_TRUE(s.Add(Req(id, 3, 5, static_cast<int32_t>(id * 10))).ok());
  std::optional<StepPlan> prefill = s.Schedule();
  ASSERT_TRUE(prefill && prefill->chunks.size() == 4);
  s.OnStepDone(*prefill, Sample(*prefill));
  for (int64_t k = 0; k < 4; ++k) {
    std::optional<StepPlan> step = s.Schedule();
    ASSERT_TRUE(step);
    ASSERT_EQ(step->chunks.size(), 4u);
    for (const ChunkPlan& c : step->chunks) {
      EXPECT_EQ(c.tokens.size(), 1u);
      EXPECT_TRUE(c.sample);
      EXPECT_EQ(c.start_pos, 3 + k);
      EXPECT_EQ(c.tokens[0], FakeToken(c.seq_id, 3 + k));  // the token sampled last step
    }
    std::vector<SeqEvent> ev = s.OnStepDone(*step, Sample(*step));
    EXPECT_EQ(ev.size(), 4u);
  }
  EXPECT_FALSE(s.HasWork());
}

TEST(SchedulerTest, MicroBatchesAreDisjoint) {
  BlockManager bm(100, 4, false);
  Scheduler s({.max_num_seqs = 8, .max_tokens_per_step = 8, .max_model_len = 128}, &bm);
  for (int64_t id = 1; id <= 6; ++id) ASSERT_TRUE(s.Add(Req(id, 4, 3)).ok());
  std::vector<StepPlan> in_flight;
  while (std::optional<StepPlan> p = s.Schedule()) in_flight.push_back(*p);
  ASSERT_EQ(in_flight.size(), 3u);
  EXPECT_EQ(s.num_in_flight_steps(), 3);
  std::set<int64_t> seen;
  for (const StepPlan& p : in_flight) {
    for (const ChunkPlan& c : p.chunks) EXPECT_TRUE(seen.insert(c.seq_id).second) << "seq " << c.seq_id << " twice";
  }
  EXPECT_EQ(seen.size(), 6u);
  EXPECT_FALSE(s.Schedule().has_value());  // everything is in flight
  // Out of order completion: the second micro-batch comes back first.
  s.OnStepDone(in_flight[1], Sample(in_flight[1]));
  std::optional<StepPlan> next = s.Schedule();
  ASSERT_TRUE(next);
  std::set<int64_t> ids;
  for (const ChunkPlan& c : next->chunks) ids.insert(c.seq_id);
  std::set<int64_t> expected;
  for (const ChunkPlan& c : in_flight[1].chunks) expected.insert(c.seq_id);
  EXPECT_EQ(ids, expected);
  EXPECT_TRUE(s.CheckIntegrity().ok()) << s.CheckIntegrity();
  // An unknown step is ignored.
  StepPlan bogus;
  bogus.step_id = 999;
  bogus.chunks = in_flight[0].chunks;
  EXPECT_TRUE(s.OnStepDone(bogus, Sample(bogus)).empty());
  EXPECT_EQ(s.num_in_flight_steps(), 3);
}

TEST(SchedulerTest, PreemptionRecomputesTheSameTokens) {
  for (bool caching : {false, true}) {
    SCOPED_TRACE(caching);
    const SchedulerConfig cfg{.max_num_seqs = 4, .max_tokens_per_step = 32, .max_model_len = 256};
    BlockManager big(1000, 4, caching), small(7, 4, caching);
    Scheduler ref(cfg, &big), tight(cfg, &small);
    for (Scheduler* s : {&ref, &tight}) {
      ASSERT_TRUE(s->Add(Req(1, 8, 10)).ok());
      ASSERT_TRUE(s->Add(Req(2, 8, 10, 300)).ok());
    }
    std::vector<StepPlan> steps;
    std::map<int64_t, Outcome> want = RunAll(ref), got = RunAll(tight, &steps);
    EXPECT_EQ(ref.num_preemptions(), 0);
    EXPECT_GT(tight.num_preemptions(), 0);
    EXPECT_EQ(got[1].num_preempted, 0);  // the most recently added one is the victim
    EXPECT_GT(got[2].num_preempted, 0);
    for (int64_t id : {1, 2}) {
      EXPECT_EQ(got[id].tokens, want[id].tokens) << "seq " << id;
      EXPECT_EQ(got[id].finish_reason, "length");
    }
    // Every chunk feeds exactly the tokens at its positions: prompt, then the sampled tokens.
    for (const StepPlan& p : steps) {
      for (const ChunkPlan& c : p.chunks) {
        const SeqRequest r = Req(c.seq_id, 8, 10, c.seq_id == 1 ? 100 : 300);
        for (size_t i = 0; i < c.tokens.size(); ++i) {
          const int64_t pos = c.start_pos + i;
          const int32_t want_tok = pos < 8 ? r.prompt[pos] : want[c.seq_id].tokens[pos - 8];
          EXPECT_EQ(c.tokens[i], want_tok) << "seq " << c.seq_id << " pos " << pos;
        }
      }
    }
    EXPECT_EQ(small.num_free_blocks(), 7);
    EXPECT_TRUE(small.CheckIntegrity().ok());
  }
}

TEST(SchedulerTest, PreemptsTheNewestRunningSequence) {
  BlockManager bm(3, 4, false);
  Scheduler s({.max_num_seqs = 4, .max_tokens_per_step = 32, .max_model_len = 64}, &bm);
  ASSERT_TRUE(s.Add(Req(1, 4, 5)).ok());  // its first decode needs a second block
  ASSERT_TRUE(s.Add(Req(2, 3, 5)).ok());
  ASSERT_TRUE(s.Add(Req(3, 3, 5)).ok());
  std::optional<StepPlan> p = s.Schedule();
  ASSERT_TRUE(p && p->chunks.size() == 3);
  s.OnStepDone(*p, Sample(*p));
  p = s.Schedule();
  ASSERT_TRUE(p);
  EXPECT_THAT(p->preempted, ::testing::ElementsAre(3));
  ASSERT_EQ(p->chunks.size(), 2u);
  EXPECT_EQ(p->chunks[0].seq_id, 1);
  EXPECT_EQ(p->chunks[0].block_table.size(), 2u);
  EXPECT_EQ(p->chunks[1].seq_id, 2);
  EXPECT_EQ(s.num_waiting(), 1);
  std::vector<SeqEvent> ev = s.OnStepDone(*p, Sample(*p));
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev[0].seq_id, 3);
  EXPECT_TRUE(ev[0].preempted);
  EXPECT_TRUE(s.CheckIntegrity().ok()) << s.CheckIntegrity();
}

TEST(SchedulerTest, AbortFreesBlocks) {
  BlockManager bm(20, 4, false);
  Scheduler s({.max_num_seqs = 4, .max_tokens_per_step = 64, .max_model_len = 128}, &bm);
  ASSERT_TRUE(s.Add(Req(1, 10, 5)).ok());
  ASSERT_TRUE(s.Add(Req(2, 10, 5)).ok());
  std::optional<StepPlan> p = s.Schedule();
  ASSERT_TRUE(p);
  EXPECT_EQ(bm.num_free_blocks(), 14);
  s.Abort(1);  // in flight: blocks stay until the step returns
  EXPECT_EQ(bm.num_free_blocks(), 14);
  std::vector<SeqEvent> ev = s.OnStepDone(*p, Sample(*p));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].seq_id, 2);
  EXPECT_EQ(bm.num_free_blocks(), 17);
  EXPECT_EQ(s.num_running(), 1);
  s.Abort(2);  // not in flight: freed now
  EXPECT_EQ(bm.num_free_blocks(), 20);
  ASSERT_TRUE(s.Add(Req(3, 10, 5)).ok());
  s.Abort(3);  // waiting
  EXPECT_EQ(s.num_waiting(), 0);
  EXPECT_FALSE(s.HasWork());
  s.Abort(42);  // unknown
  EXPECT_TRUE(s.CheckIntegrity().ok()) << s.CheckIntegrity();
}

TEST(SchedulerTest, FinishByStopTokenAndLength) {
  BlockManager bm(50, 4, false);
  Scheduler s({.max_num_seqs = 4, .max_tokens_per_step = 64, .max_model_len = 12}, &bm);
  SeqRequest eos = Req(1, 3, 10), ignore = Req(2, 3, 4), stop = Req(3, 3, 10), model_len = Req(4, 9, 10);
  ignore.ignore_eos = true;
  model_len.ignore_eos = true;
  stop.ignore_eos = true;
  stop.stop_token_ids = {7};
  for (auto& r : {eos, ignore, stop, model_len}) ASSERT_TRUE(s.Add(r).ok());
  std::map<int64_t, Outcome> out;
  std::map<int64_t, bool> stop_flag;
  int step_no = 0;
  while (s.HasWork()) {
    std::optional<StepPlan> p = s.Schedule();
    ASSERT_TRUE(p);
    std::vector<std::pair<int64_t, int32_t>> sampled;  // EOS at the 2nd step, 7 at the 3rd
    for (const ChunkPlan& c : p->chunks) sampled.push_back({c.seq_id, step_no == 1 ? kEos : step_no == 2 ? 7 : 50});
    for (const SeqEvent& e : s.OnStepDone(*p, sampled)) {
      out[e.seq_id].tokens.push_back(*e.token);
      if (e.finished) out[e.seq_id].finish_reason = e.finish_reason;
      stop_flag[e.seq_id] = e.is_stop_token;
    }
    ++step_no;
  }
  EXPECT_THAT(out[1].tokens, ::testing::ElementsAre(50, kEos));  // the stop token is reported
  EXPECT_EQ(out[1].finish_reason, "stop");
  EXPECT_TRUE(stop_flag[1]);
  EXPECT_THAT(out[2].tokens, ::testing::ElementsAre(50, kEos, 7, 50));  // ignores EOS; 7 is not its stop
  EXPECT_EQ(out[2].finish_reason, "length");
  EXPECT_FALSE(stop_flag[2]);
  EXPECT_THAT(out[3].tokens, ::testing::ElementsAre(50, kEos, 7));  // stop_token_ids hold with ignore_eos
  EXPECT_EQ(out[3].finish_reason, "stop");
  EXPECT_THAT(out[4].tokens, ::testing::ElementsAre(50, kEos, 7));  // 9 + 3 = max_model_len
  EXPECT_EQ(out[4].finish_reason, "length");
  EXPECT_EQ(bm.num_free_blocks(), 50);
}

TEST(SchedulerTest, MaxModelLen) {
  BlockManager bm(50, 4, false);
  Scheduler s({.max_num_seqs = 4, .max_tokens_per_step = 64, .max_model_len = 12}, &bm);
  ASSERT_TRUE(s.Add(Req(1, 9, 100)).ok());
  ASSERT_TRUE(s.Add(Req(2, 12, 100)).ok());  // a prompt of max_model_len still gets one token
  std::map<int64_t, Outcome> out = RunAll(s);
  EXPECT_EQ(out[1].tokens.size(), 3u);
  EXPECT_EQ(out[1].finish_reason, "length");
  EXPECT_EQ(out[2].tokens.size(), 1u);
}

TEST(SchedulerTest, AddRejectsBadRequests) {
  BlockManager bm(4, 4, false);  // 16 tokens of KV in all
  Scheduler s({.max_num_seqs = 4, .max_tokens_per_step = 64, .max_model_len = 20}, &bm);
  EXPECT_EQ(s.Add(Req(1, 0, 5)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Add(Req(1, 4, 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Add(Req(1, 21, 5)).code(), absl::StatusCode::kInvalidArgument);  // > max_model_len
  EXPECT_EQ(s.Add(Req(1, 17, 5)).code(), absl::StatusCode::kInvalidArgument);  // > the KV pool
  SeqRequest bad_sampling = Req(1, 4, 5);
  bad_sampling.sampling.temperature = -1.f;
  EXPECT_EQ(s.Add(bad_sampling).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.Add(Req(1, 16, 5)).ok());
  EXPECT_EQ(s.Add(Req(1, 4, 5)).code(), absl::StatusCode::kAlreadyExists);
  // A pool-sized prompt runs, then stops for length when the pool cannot hold one more position.
  std::map<int64_t, Outcome> out = RunAll(s);
  EXPECT_EQ(out[1].tokens.size(), 1u);
  EXPECT_EQ(out[1].finish_reason, "length");

  Scheduler broken({.max_num_seqs = 8, .max_tokens_per_step = 4, .max_model_len = 20}, &bm);
  EXPECT_FALSE(broken.Add(Req(1, 4, 5)).ok());
  EXPECT_FALSE(broken.Schedule().has_value());
}

TEST(SchedulerTest, PrefixCacheReportedOnFirstSchedule) {
  BlockManager bm(50, 4, true);
  Scheduler s({.max_num_seqs = 4, .max_tokens_per_step = 64, .max_model_len = 128}, &bm);
  ASSERT_TRUE(s.Add(Req(1, 9, 2)).ok());
  std::map<int64_t, Outcome> first = RunAll(s);
  EXPECT_EQ(first[1].num_cached, 0);
  ASSERT_TRUE(s.Add(Req(2, 9, 2)).ok());  // same prompt
  std::optional<StepPlan> p = s.Schedule();
  ASSERT_TRUE(p && p->chunks.size() == 1);
  EXPECT_EQ(p->chunks[0].start_pos, 8);
  EXPECT_EQ(p->chunks[0].tokens, std::vector<int32_t>{108});
  // The workers check the shared blocks against the cached tokens (worker/service/kv_ownership.h).
  EXPECT_EQ(p->chunks[0].cached_prefix, (std::vector<int32_t>{100, 101, 102, 103, 104, 105, 106, 107}));
  EXPECT_TRUE(p->chunks[0].sample);
  std::vector<SeqEvent> ev = s.OnStepDone(*p, Sample(*p));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].num_cached_tokens, 8);
  p = s.Schedule();
  ASSERT_TRUE(p);
  EXPECT_TRUE(p->chunks[0].cached_prefix.empty());  // only the first chunk after the hit
  ev = s.OnStepDone(*p, Sample(*p));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].num_cached_tokens, -1);  // only once
  EXPECT_EQ(bm.prefix_hit_tokens(), 8);
}

// A lookahead must not release the sliding blocks of the chunk in flight before it: they enter
// the prefix cache with their full blocks only when that chunk completes (a prompt prefilled in
// one step, then decoded with lookahead, is a whole hit for the next request sharing it).
TEST(SchedulerTest, LookaheadKeepsTheSlidingWindowCacheable) {
  const int64_t bs = 4, window = 6;
  BlockManager bm(64, bs, true, /*num_sliding_blocks=*/40, window);
  Scheduler s({.max_num_seqs = 4, .max_tokens_per_step = 64, .max_model_len = 128}, &bm);
  ASSERT_TRUE(s.Add(Req(1, 40, 6)).ok());
  std::optional<StepPlan> prefill = s.Schedule(true);
  ASSERT_TRUE(prefill && prefill->chunks.size() == 1 && prefill->chunks[0].tokens.size() == 40u);
  std::optional<StepPlan> ahead = s.Schedule(true);  // planned while the prefill runs
  ASSERT_TRUE(ahead && ahead->chunks.size() == 1);
  EXPECT_TRUE(ahead->chunks[0].follow);
  EXPECT_EQ(ahead->chunks[0].start_pos, 40);
  std::deque<StepPlan> flight = {*prefill, *ahead};
  while (!flight.empty()) {
    StepPlan done = flight.front();
    flight.pop_front();
    s.OnStepDone(done, Sample(done));
    ASSERT_TRUE(s.CheckIntegrity().ok()) << s.CheckIntegrity();
    if (std::optional<StepPlan> next = s.Schedule(true)) flight.push_back(*next);
  }
  EXPECT_FALSE(s.HasWork());
  ASSERT_TRUE(s.Add(Req(2, 40, 2)).ok());  // the same prompt: all but its last block's tokens cached
  std::optional<StepPlan> p = s.Schedule(true);
  ASSERT_TRUE(p && p->chunks.size() == 1);
  EXPECT_EQ(p->chunks[0].start_pos, 36);
  std::vector<SeqEvent> ev = s.OnStepDone(*p, Sample(*p));
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev[0].num_cached_tokens, 36);
}

TEST(SchedulerTest, MissingSampleIsRetried) {
  BlockManager bm(50, 4, false);
  Scheduler s({.max_num_seqs = 4, .max_tokens_per_step = 64, .max_model_len = 128}, &bm);
  ASSERT_TRUE(s.Add(Req(1, 6, 2)).ok());
  std::optional<StepPlan> p = s.Schedule();
  ASSERT_TRUE(p);
  std::vector<SeqEvent> ev = s.OnStepDone(*p, {});
  ASSERT_EQ(ev.size(), 1u);  // only the cache report of the first step
  EXPECT_FALSE(ev[0].token.has_value());
  EXPECT_FALSE(ev[0].finished);
  p = s.Schedule();
  ASSERT_TRUE(p && p->chunks.size() == 1);
  EXPECT_EQ(p->chunks[0].start_pos, 5);
  EXPECT_EQ(p->chunks[0].tokens, std::vector<int32_t>{105});
  EXPECT_TRUE(p->chunks[0].sample);
}

}  // namespace
}  // namespace moeshard
