// Tables by delta on the coordinator's side (coordinator/table_deltas.h): what each step may
// leave out of a chunk's table, as the workers record it (worker/service/kv_ownership.h).
#include "coordinator/table_deltas.h"

#include "gtest/gtest.h"

namespace moeshard {
namespace {

ChunkPlan Chunk(int64_t seq, int64_t start, int64_t n, std::vector<int32_t> table) {
  ChunkPlan c;
  c.seq_id = seq;
  c.start_pos = start;
  c.tokens.assign(static_cast<size_t>(n), 1);
  c.block_table = std::move(table);
  return c;
}

StepRequest Step(std::vector<ChunkPlan> chunks, std::vector<int64_t> released = {}, std::vector<int64_t> preempted = {}) {
  StepRequest s;
  s.chunks = std::move(chunks);
  s.released_seqs = std::move(released);
  s.preempted_seqs = std::move(preempted);
  return s;
}

TEST(TableDeltasTest, SendsWhatTheWorkersDoNotHold) {
  TableDeltas d;
  d.Reset(4);
  // A 10-token prompt reserved 4 blocks; its chunk reads 3 of them: those 3 are held after.
  StepRequest prefill = Step({Chunk(1, 0, 10, {7, 8, 9, 10})});
  EXPECT_EQ(d.Held(prefill, prefill.chunks[0]), 0);
  d.Committed(prefill);
  StepRequest decode = Step({Chunk(1, 10, 1, {7, 8, 9, 10})});
  EXPECT_EQ(d.Held(decode, decode.chunks[0]), 3);  // only block 10 travels
  d.Committed(decode);
  StepRequest next = Step({Chunk(1, 12, 1, {7, 8, 9, 10})});
  EXPECT_EQ(d.Held(next, next.chunks[0]), 3);  // position 11 was the last read: still 3 blocks
  d.Committed(Step({Chunk(1, 11, 2, {7, 8, 9, 10})}));
  EXPECT_EQ(d.Held(next, next.chunks[0]), 4);
  // Never more than the chunk's own table.
  StepRequest short_table = Step({Chunk(1, 0, 1, {7})});
  EXPECT_EQ(d.Held(short_table, short_table.chunks[0]), 1);
}

TEST(TableDeltasTest, ReleasedPreemptedFailedAndNewHandshakesSendWholeTables) {
  TableDeltas d;
  StepRequest prefill = Step({Chunk(1, 0, 8, {3, 4}), Chunk(2, 0, 8, {5, 6})});
  d.Committed(prefill);  // before any handshake nothing is recorded
  StepRequest decode = Step({Chunk(1, 8, 1, {3, 4, 9}), Chunk(2, 8, 1, {5, 6, 11})});
  EXPECT_EQ(d.Held(decode, decode.chunks[0]), 0);
  d.Reset(4);
  d.Committed(prefill);
  EXPECT_EQ(d.Held(decode, decode.chunks[0]), 2);
  // Preempted or released in the step being built: whole table; forgotten once it ran.
  StepRequest pre = Step({Chunk(1, 0, 8, {12, 13})}, {}, {1});
  EXPECT_EQ(d.Held(pre, pre.chunks[0]), 0);
  StepRequest rel = Step({}, {2});
  d.Committed(rel);
  EXPECT_EQ(d.Held(decode, decode.chunks[1]), 0);
  EXPECT_EQ(d.Held(decode, decode.chunks[0]), 2);
  // A failed step, or a new handshake, forgets everything.
  d.Forget();
  EXPECT_EQ(d.Held(decode, decode.chunks[0]), 0);
  d.Committed(prefill);
  d.Reset(4);
  EXPECT_EQ(d.Held(decode, decode.chunks[0]), 0);
}

ChunkPlan SlidingChunk(int64_t seq, int64_t start, int64_t n, std::vector<int32_t> table, std::vector<int32_t> sliding) {
  ChunkPlan c = Chunk(seq, start, n, std::move(table));
  c.sliding_table = std::move(sliding);
  return c;
}

// Block size 4, window 6. The sliding table's entries turn into -1 as the window moves on:
// only its leading run of -1 stays true of the workers' record, so the rest is always resent.
TEST(TableDeltasTest, SlidingTablesResendEverythingAfterTheirReleasedRun) {
  TableDeltas d;
  d.Reset(4);
  StepRequest prefill = Step({SlidingChunk(1, 0, 10, {7, 8, 9}, {20, 21, 22})});
  EXPECT_EQ(d.HeldSliding(prefill, prefill.chunks[0]), 0);
  d.Committed(prefill);
  // Position 10 sees 5..10: block 0 of the sliding table is released in this step.
  StepRequest decode = Step({SlidingChunk(1, 10, 1, {7, 8, 9}, {-1, 21, 22})});
  EXPECT_EQ(d.Held(decode, decode.chunks[0]), 3);
  EXPECT_EQ(d.HeldSliding(decode, decode.chunks[0]), 0);  // entry 0 changed: resent
  d.Committed(decode);
  StepRequest next = Step({SlidingChunk(1, 11, 1, {7, 8, 9}, {-1, 21, 22})});
  EXPECT_EQ(d.HeldSliding(next, next.chunks[0]), 1);  // the -1 is held; 21 and 22 travel again
  d.Committed(next);
  // Positions 12..17 (a chunk) see from 6 on: block 1 goes, blocks 3 and 4 come.
  StepRequest chunk = Step({SlidingChunk(1, 12, 6, {7, 8, 9, 10, 11}, {-1, -1, 22, 23, 24})});
  EXPECT_EQ(d.HeldSliding(chunk, chunk.chunks[0]), 1);
  d.Committed(chunk);
  StepRequest after = Step({SlidingChunk(1, 18, 1, {7, 8, 9, 10, 11}, {-1, -1, -1, 23, 24})});
  EXPECT_EQ(d.HeldSliding(after, after.chunks[0]), 2);
  EXPECT_EQ(d.Held(after, after.chunks[0]), 5);
  // Preempted: whole tables again, both kinds.
  StepRequest pre = Step({SlidingChunk(1, 18, 1, {7, 8, 9, 10, 11}, {-1, -1, -1, 23, 24})}, {}, {1});
  EXPECT_EQ(d.HeldSliding(pre, pre.chunks[0]), 0);
  EXPECT_EQ(d.Held(pre, pre.chunks[0]), 0);
  // A prefix-cache hit's first chunk starts with -1 entries the workers never saw: none held.
  StepRequest hit = Step({SlidingChunk(2, 12, 2, {1, 2, 3, 4}, {-1, -1, 5, 6})});
  EXPECT_EQ(d.HeldSliding(hit, hit.chunks[0]), 0);
  d.Committed(hit);
  StepRequest hit_next = Step({SlidingChunk(2, 14, 1, {1, 2, 3, 4}, {-1, -1, 5, 6})});
  EXPECT_EQ(d.HeldSliding(hit_next, hit_next.chunks[0]), 2);
}

}  // namespace
}  // namespace moeshard
