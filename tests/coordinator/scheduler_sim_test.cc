// Randomized simulation of the scheduler: requests arrive, steps are scheduled several at a time
// (pipeline micro-batches), complete in or out of order, sampled tokens come from a fake that
// depends only on (sequence, position); some samples go missing, some requests are aborted. A
// model of every sequence checks each plan and event against the contract. With lookahead, two
// steps in flight complete in order (as the engine applies them) and a simulated worker checks
// that each follow chunk continues the token it drew for the sequence in the step before.
#include <cstdio>
#include <deque>
#include <map>
#include <random>
#include <set>

#include "coordinator/scheduler.h"
#include "gtest/gtest.h"

namespace moeshard {
namespace {

constexpr int32_t kSimEos = 2;

int32_t SimToken(int64_t seq_id, int64_t pos) {
  const uint64_t h = (static_cast<uint64_t>(seq_id) * 0x9e3779b97f4a7c15ULL) ^ (static_cast<uint64_t>(pos) * 0xbf58476d1ce4e5b9ULL);
  const uint64_t m = (h ^ (h >> 29)) * 0x94d049bb133111ebULL;
  return (m >> 40) % 17 == 0 ? kSimEos : static_cast<int32_t>(1000 + (m >> 20) % 997);
}

struct Model {
  SeqRequest req;
  std::vector<int32_t> tokens, out;
  int64_t computed = 0;
  int in_flight = 0;
  bool needs_admission = true, aborted = false, finished = false;
  std::string reason;
};

struct SimStats {
  int64_t preemptions = 0, cache_hit_tokens = 0, aborted = 0, finished = 0, follows = 0;
};

// sliding: a model with sliding-window layers, its second pool between the least the scheduler
// takes (one sequence's window and a full step) and a little more, so that sequences contend.
void RunSim(uint32_t seed, SimStats* stats, bool sliding = false, bool lookahead = false) {
  std::mt19937 rng(seed);
  auto rnd = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t bs = int64_t{1} << rnd(0, 3), num_blocks = rnd(6, 40);
  const bool caching = rnd(0, 1);
  SchedulerConfig cfg;
  cfg.max_num_seqs = rnd(1, 8);
  cfg.max_tokens_per_step = rnd(cfg.max_num_seqs, 48);
  cfg.max_model_len = rnd(8, 80);
  const size_t depth = lookahead ? 2 : rnd(1, 4);
  const bool fifo = lookahead || rnd(0, 1);
  const int64_t window = sliding ? rnd(1, 24) : 0;
  const int64_t sliding_blocks = sliding ? (window - 1 + cfg.max_tokens_per_step + bs - 1) / bs + 1 + rnd(0, 8) : 0;
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " bs " << bs << " blocks " << num_blocks << " caching "
                                    << caching << " seqs " << cfg.max_num_seqs << " budget " << cfg.max_tokens_per_step
                                    << " len " << cfg.max_model_len << " depth " << depth << " fifo " << fifo
                                    << " window " << window << " sliding blocks " << sliding_blocks
                                    << " lookahead " << lookahead);
  BlockManager bm(num_blocks, bs, caching, sliding_blocks, window);
  Scheduler s(cfg, &bm);
  std::vector<std::vector<int32_t>> bases(2);
  for (auto& b : bases) {
    for (int i = 0; i < 80; ++i) b.push_back(static_cast<int32_t>(rnd(0, 50)));
  }
  std::map<int64_t, Model> m;
  std::deque<StepPlan> in_flight;
  std::map<int64_t, std::pair<int64_t, int64_t>> drawn;  // the worker's last draw: seq -> (step, position)
  const int64_t kRequests = 50;
  int64_t next_id = 0, preempted_events = 0, plan_preemptions = 0;
  for (int iter = 0; iter < 200000; ++iter) {
    if (next_id < kRequests && rnd(0, 2) == 0) {  // arrivals
      SeqRequest r;
      r.seq_id = next_id++;
      const auto& base = bases[rnd(0, 1)];
      r.prompt.assign(base.begin(), base.begin() + rnd(1, 60));
      for (int64_t i = rnd(0, 3); i > 0; --i) r.prompt.push_back(static_cast<int32_t>(rnd(0, 50)));
      r.max_new_tokens = rnd(1, 12);
      r.eos_token_ids = {kSimEos};
      r.ignore_eos = rnd(0, 3) == 0;
      const int64_t len = r.prompt.size();
      const bool fits = len <= cfg.max_model_len && (len + bs - 1) / bs <= num_blocks;
      absl::Status st = s.Add(r);
      ASSERT_EQ(st.ok(), fits) << st;
      if (fits) {
        Model& q = m[r.seq_id];
        q.req = r;
        q.tokens = r.prompt;
      }
    }
    if (!m.empty() && rnd(0, 60) == 0) {  // abort a random request, wherever it is
      auto it = std::next(m.begin(), rnd(0, m.size() - 1));
      if (!it->second.finished && !it->second.aborted) {
        s.Abort(it->first);
        it->second.aborted = true;
      }
    }
    while (in_flight.size() < depth) {
      std::optional<StepPlan> p = s.Schedule(lookahead);
      if (!p) break;
      ASSERT_FALSE(p->chunks.empty());
      ASSERT_LE(p->num_tokens(), cfg.max_tokens_per_step);
      ASSERT_LE(static_cast<int64_t>(p->chunks.size()), cfg.max_num_seqs);
      plan_preemptions += p->preempted.size();
      for (int64_t id : p->preempted) {
        Model& q = m.at(id);
        ASSERT_EQ(q.in_flight, 0) << "preempted an in-flight sequence";
        q.needs_admission = true;
        q.computed = 0;
      }
      std::set<int64_t> ids;
      for (const ChunkPlan& c : p->chunks) {
        ASSERT_TRUE(ids.insert(c.seq_id).second);
        Model& q = m.at(c.seq_id);
        ASSERT_FALSE(q.aborted || q.finished);
        const int64_t total = q.tokens.size(), end = c.start_pos + c.tokens.size();
        if (c.follow) {  // the token at `total`, drawn by the step in flight
          ASSERT_TRUE(lookahead);
          ASSERT_EQ(q.in_flight, 1) << "seq " << c.seq_id;
          ASSERT_EQ(c.start_pos, total);
          ASSERT_EQ(c.tokens, std::vector<int32_t>{-1});
          ASSERT_TRUE(c.sample);
          const auto d = drawn.find(c.seq_id);
          ASSERT_TRUE(d != drawn.end() && d->second == std::make_pair(p->step_id - 1, c.start_pos))
              << "seq " << c.seq_id << " follows no draw of step " << p->step_id - 1;
          ASSERT_LT(static_cast<int64_t>(q.out.size()) + 1, q.req.max_new_tokens);
          ASSERT_GE(static_cast<int64_t>(c.block_table.size()) * bs, end);
          ++stats->follows;
        } else {
          ASSERT_EQ(q.in_flight, 0) << "seq " << c.seq_id << " in two steps";
        }
        if (c.sample) drawn[c.seq_id] = {p->step_id, end};
        if (c.follow) {
        } else if (q.needs_admission) {
          ASSERT_EQ(c.start_pos % bs, 0);
          ASSERT_TRUE(caching || c.start_pos == 0);
          q.needs_admission = false;
        } else {
          ASSERT_EQ(c.start_pos, q.computed) << "seq " << c.seq_id;
        }
        ASSERT_GE(c.tokens.size(), 1u);
        if (!c.follow) {
          ASSERT_LE(end, total);
          ASSERT_EQ(c.tokens, std::vector<int32_t>(q.tokens.begin() + c.start_pos, q.tokens.begin() + end));
          ASSERT_EQ(c.sample, end == total);
        }
        ASSERT_GE(static_cast<int64_t>(c.block_table.size()) * bs, end);
        if (sliding) {  // -1 exactly before the window of start_pos, real blocks through `end`
          ASSERT_GE(static_cast<int64_t>(c.sliding_table.size()) * bs, end);
          // (A lookahead releases nothing: blocks before its window may still be real.)
          const int64_t first = bm.FirstSlidingBlock(c.start_pos);
          for (int64_t i = 0; i < (end + bs - 1) / bs; ++i) {
            if (c.follow && i < first) continue;
            ASSERT_EQ(c.sliding_table[i] < 0, i < first) << i;
          }
        } else {
          ASSERT_TRUE(c.sliding_table.empty());
        }
        ++q.in_flight;
      }
      in_flight.push_back(std::move(*p));
    }
    absl::Status st = s.CheckIntegrity();
    ASSERT_TRUE(st.ok()) << "iter " << iter << ": " << st;
    if (in_flight.empty()) {
      ASSERT_FALSE(s.HasWork()) << "stalled: work left, nothing in flight, nothing scheduled";
      if (next_id == kRequests) break;
      continue;
    }
    const size_t idx = fifo ? 0 : rnd(0, in_flight.size() - 1);
    StepPlan step = std::move(in_flight[idx]);
    in_flight.erase(in_flight.begin() + idx);
    std::vector<std::pair<int64_t, int32_t>> sampled;
    for (const ChunkPlan& c : step.chunks) {
      Model& q = m.at(c.seq_id);
      --q.in_flight;
      const bool dropped = c.sample && rnd(0, 29) == 0;
      if (c.sample && !dropped) sampled.push_back({c.seq_id, SimToken(c.seq_id, c.start_pos + c.tokens.size())});
      // A lookahead counts only where the step before left its sequence (its token came).
      if (c.follow && c.start_pos != q.computed) continue;
      q.computed = c.start_pos + c.tokens.size() - (dropped ? 1 : 0);
    }
    for (const SeqEvent& e : s.OnStepDone(step, sampled)) {
      Model& q = m.at(e.seq_id);
      ASSERT_FALSE(q.aborted) << "event after abort for seq " << e.seq_id;
      ASSERT_FALSE(q.finished) << "event after finish for seq " << e.seq_id;
      preempted_events += e.preempted;
      if (e.token) {
        ASSERT_EQ(*e.token, SimToken(e.seq_id, q.tokens.size())) << "seq " << e.seq_id;
        q.tokens.push_back(*e.token);
        q.out.push_back(*e.token);
        ASSERT_EQ(e.is_stop_token, *e.token == kSimEos && !q.req.ignore_eos);
      }
      if (e.finished) {
        q.finished = true;
        q.reason = e.finish_reason;
      }
    }
    st = s.CheckIntegrity();
    ASSERT_TRUE(st.ok()) << "iter " << iter << ": " << st;
  }
  ASSERT_EQ(next_id, kRequests);
  ASSERT_FALSE(s.HasWork());
  EXPECT_EQ(plan_preemptions, s.num_preemptions());
  EXPECT_LE(preempted_events, plan_preemptions);  // aborts drop undelivered events
  for (const auto& [id, q] : m) {
    if (q.aborted) continue;
    ASSERT_TRUE(q.finished) << "seq " << id << " never finished";
    ASSERT_LE(static_cast<int64_t>(q.out.size()), q.req.max_new_tokens);
    for (size_t i = 0; i + 1 < q.out.size(); ++i) {
      ASSERT_TRUE(q.out[i] != kSimEos || q.req.ignore_eos) << "seq " << id << " went past a stop token";
    }
    const int64_t total = q.tokens.size();
    if (q.reason == "stop") {
      ASSERT_TRUE(q.out.back() == kSimEos && !q.req.ignore_eos);
    } else {
      ASSERT_EQ(q.reason, "length");
      ASSERT_TRUE(static_cast<int64_t>(q.out.size()) == q.req.max_new_tokens || total >= cfg.max_model_len ||
                  (total + bs - 1) / bs > num_blocks)
          << "seq " << id << " stopped early for length";
    }
  }
  EXPECT_EQ(bm.num_free_blocks(), num_blocks);
  EXPECT_EQ(bm.Usage(), 0.0);
  EXPECT_EQ(bm.Stats(KvKind::kSliding).used, 0);
  stats->preemptions += s.num_preemptions();
  stats->cache_hit_tokens += bm.prefix_hit_tokens();
  for (const auto& [id, q] : m) (q.aborted ? stats->aborted : stats->finished) += 1;
}

TEST(SchedulerSimTest, RandomizedInvariantsAndCompletion) {
  SimStats stats;
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    RunSim(seed, &stats);
    if (::testing::Test::HasFatalFailure()) return;
  }
  // The runs exercised what they are meant to.
  EXPECT_GT(stats.preemptions, 100);
  EXPECT_GT(stats.cache_hit_tokens, 1000);
  EXPECT_GT(stats.aborted, 50);
  EXPECT_GT(stats.finished, 5000);
  std::printf("sim: %ld preemptions, %ld cached tokens, %ld aborted, %ld finished\n", static_cast<long>(stats.preemptions),
              static_cast<long>(stats.cache_hit_tokens), static_cast<long>(stats.aborted), static_cast<long>(stats.finished));
}

TEST(SchedulerSimTest, RandomizedInvariantsAndCompletionWithASlidingPool) {
  SimStats stats;
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    RunSim(seed, &stats, /*sliding=*/true);
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(stats.preemptions, 100);
  EXPECT_GT(stats.cache_hit_tokens, 500);
  EXPECT_GT(stats.finished, 5000);
  std::printf("sim with a sliding pool: %ld preemptions, %ld cached tokens, %ld aborted, %ld finished\n",
              static_cast<long>(stats.preemptions), static_cast<long>(stats.cache_hit_tokens),
              static_cast<long>(stats.aborted), static_cast<long>(stats.finished));
}

TEST(SchedulerSimTest, RandomizedInvariantsAndCompletionWithLookahead) {
  for (bool sliding : {false, true}) {
    SimStats stats;
    for (uint32_t seed = 1; seed <= 300; ++seed) {
      RunSim(seed, &stats, sliding, /*lookahead=*/true);
      if (::testing::Test::HasFatalFailure()) return;
    }
    EXPECT_GT(stats.follows, 2000);
    EXPECT_GT(stats.preemptions, 50);
    EXPECT_GT(stats.cache_hit_tokens, 500);
    EXPECT_GT(stats.aborted, 50);
    EXPECT_GT(stats.finished, 5000);
    std::printf("sim with lookahead%s: %ld lookahead chunks, %ld preemptions, %ld cached tokens, %ld aborted, %ld finished\n",
                sliding ? " and a sliding pool" : "", static_cast<long>(stats.follows), static_cast<long>(stats.preemptions),
                static_cast<long>(stats.cache_hit_tokens), static_cast<long>(stats.aborted),
                static_cast<long>(stats.finished));
  }
}

}  // namespace
}  // namespace moeshard
