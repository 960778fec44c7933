// Block tables against the sequences' own blocks (worker/service/kv_ownership.h): a step may
// read and write the blocks its sequence wrote, blocks of no live sequence, and full blocks of
// another live sequence only through the prefix cache (its cached_prefix must hold the tokens
// the blocks were written with). Block size 4 throughout. Then the sliding pool's table.
#include "worker/service/kv_ownership.h"

#include <numeric>
#include <string>

#include "gtest/gtest.h"

namespace moeshard {
namespace {

constexpr int kBs = 4;

v1::ChunkProto Chunk(int64_t seq, int64_t start, std::vector<int32_t> tokens, std::vector<int32_t> table,
                     std::vector<int32_t> cached_prefix = {}) {
  v1::ChunkProto c;
  c.set_seq_id(seq);
  c.set_start_pos(start);
  c.mutable_tokens()->Add(tokens.begin(), tokens.end());
  c.mutable_block_table()->Add(table.begin(), table.end());
  c.mutable_cached_prefix()->Add(cached_prefix.begin(), cached_prefix.end());
  return c;
}

v1::StepRequest Step(std::vector<v1::ChunkProto> chunks, std::vector<int64_t> released = {},
                     std::vector<int64_t> preempted = {}) {
  v1::StepRequest r;
  for (auto& c : chunks) *r.add_chunks() = std::move(c);
  r.mutable_released_seqs()->Add(released.begin(), released.end());
  r.mutable_preempted_seqs()->Add(preempted.begin(), preempted.end());
  return r;
}

std::vector<int32_t> Range(int32_t from, int32_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

class KvOwnershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kv_.Reset(kBs, 16);
    // The victim, sequence 1: a 10-token prompt in blocks 0, 1, 2 (two full blocks).
    Run(Step({Chunk(1, 0, Range(100, 10), {0, 1, 2})}));
  }
  void Run(const v1::StepRequest& r) {
    ASSERT_TRUE(kv_.Check(r).ok()) << kv_.Check(r).message();
    kv_.Commit(r);
  }
  // Expects Check to refuse `r`; returns the refusal's message.
  std::string Refusal(const v1::StepRequest& r) {
    absl::Status st = kv_.Check(r);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st.message();
    return std::string(st.message());
  }
  KvOwnership kv_;
};

TEST_F(KvOwnershipTest, ASequenceContinuesInItsOwnBlocks) {
  Run(Step({Chunk(1, 10, {7}, {0, 1, 2})}));
  Run(Step({Chunk(1, 11, {8}, {0, 1, 2})}));
  Run(Step({Chunk(1, 12, {9}, {0, 1, 2, 3})}));  // the table grew
  Run(Step({Chunk(1, 12, {9}, {0, 1, 2, 3})}));  // a sampled position runs again
  EXPECT_EQ(kv_.num_live(), 1);
}

TEST_F(KvOwnershipTest, ReadingAnotherLiveSequencesBlocksIsRefused) {
  // A new sequence whose table starts with the victim's blocks, without their tokens: the
  // cross-user read of issue 15 (one token, reading the victim's KV for its logprobs).
  std::string st = Refusal(Step({Chunk(2, 8, {5}, {0, 1, 3})}));
  EXPECT_NE(st.find("live sequence 1"), std::string::npos) << st;
  EXPECT_NE(st.find("KV block 0"), std::string::npos) << st;
  // A wrong guess of the tokens, and the right tokens of block 0 with a wrong block 1.
  Refusal(Step({Chunk(2, 8, {5}, {0, 1, 3}, Range(0, 8))}));
  std::vector<int32_t> half = Range(100, 8);
  half[7] = 0;
  Refusal(Step({Chunk(2, 8, {5}, {0, 1, 3}, half)}));
  // The victim's last, partly written block, read or written by another sequence.
  Refusal(Step({Chunk(2, 0, {5}, {2})}));
  Refusal(Step({Chunk(2, 8, {5}, {7, 8, 2}, Range(0, 8))}));
  // A chain: block 1's tokens match but block 0's do not, so block 1 holds other KV.
  std::vector<int32_t> other = Range(100, 8);
  other[0] = 1;
  Refusal(Step({Chunk(2, 8, {5}, {9, 1, 3}, other)}));
}

TEST_F(KvOwnershipTest, WritingAnotherLiveSequencesBlocksIsRefused) {
  std::string st = Refusal(Step({Chunk(2, 0, Range(0, 6), {5, 1})}));
  EXPECT_NE(st.find("KV block 1"), std::string::npos) << st;
  EXPECT_NE(st.find("live sequence 1"), std::string::npos) << st;
  // With the victim's own sequence id, a different table.
  Refusal(Step({Chunk(1, 10, {7}, {0, 4, 2})}));
}

TEST_F(KvOwnershipTest, PrefixCacheSharingPasses) {
  // Sequence 2's prompt starts with the victim's 8 tokens: the coordinator's prefix cache gives
  // it blocks 0 and 1, read-only, with their tokens.
  Run(Step({Chunk(2, 8, {50, 51}, {0, 1, 5}, Range(100, 8))}));
  Run(Step({Chunk(2, 10, {52}, {0, 1, 5})}));
  // Both sequences go on; a third shares sequence 2's own full block chain too.
  Run(Step({Chunk(1, 10, {7}, {0, 1, 2}), Chunk(2, 11, {53}, {0, 1, 5})}));
  std::vector<int32_t> prefix = Range(100, 8);
  prefix.insert(prefix.end(), {50, 51, 52, 53});
  Run(Step({Chunk(3, 12, {1}, {0, 1, 5, 6}, prefix)}));
  // But a shared block is not written by the sequence sharing it.
  Refusal(Step({Chunk(2, 4, {9}, {0, 1, 5})}));
}

TEST_F(KvOwnershipTest, ReleasedAndPreemptedBlocksMayBeReused) {
  Refusal(Step({Chunk(2, 0, Range(0, 5), {1, 0})}));
  // The coordinator preempted sequence 1 while it planned this step, and gave its blocks away.
  Run(Step({Chunk(2, 0, Range(0, 5), {1, 0})}, {}, {1}));
  // Sequence 1 restarts in new blocks (its old ones belong to sequence 2 now).
  Run(Step({Chunk(1, 0, Range(100, 10), {3, 4, 5})}));
  Refusal(Step({Chunk(3, 0, {1}, {4})}));
  // Released: sequence 1 finished; its blocks may be written by another.
  Run(Step({Chunk(3, 0, {1}, {4})}, {1}));
  EXPECT_EQ(kv_.num_live(), 2);
}

TEST_F(KvOwnershipTest, ARefusalChangesNothing) {
  // A good chunk beside a bad one: neither is recorded.
  Refusal(Step({Chunk(5, 0, {1}, {6}), Chunk(2, 0, {5}, {0})}));
  EXPECT_EQ(kv_.num_live(), 1);
  Run(Step({Chunk(5, 0, {1}, {7})}));  // had the table {6} been recorded, this would change it
  Refusal(Step({Chunk(2, 0, {5}, {16})}, {1}));     // outside the pool of 16
  Refusal(Step({Chunk(2, 0, Range(0, 5), {6})}));   // a short table
  Refusal(Step({Chunk(2, 0, {5}, {-1})}));
}

// Tables by delta (ChunkProto.table_start): a live sequence's chunk sends its table from an
// index on; the worker fills in the entries it recorded, so a delta cannot name other blocks.
v1::ChunkProto Delta(int64_t seq, int64_t start, std::vector<int32_t> tokens, int32_t from,
                     std::vector<int32_t> rest) {
  v1::ChunkProto c = Chunk(seq, start, std::move(tokens), std::move(rest));
  c.set_table_start(from);
  return c;
}

TEST_F(KvOwnershipTest, ADeltaBecomesTheRecordedTableAndTheNewEntries) {
  // Sequence 1 holds blocks 0, 1, 2 (positions 0..9); its decode at position 10 sends nothing
  // of the table (all three held), then position 12 one new block.
  v1::StepRequest r = Step({Delta(1, 10, {7}, 3, {})});
  ASSERT_TRUE(KvOwnership::HasDeltas(r));
  ASSERT_TRUE(kv_.ExpandTables(&r).ok());
  EXPECT_FALSE(KvOwnership::HasDeltas(r));
  EXPECT_EQ(std::vector<int32_t>(r.chunks(0).block_table().begin(), r.chunks(0).block_table().end()),
            (std::vector<int32_t>{0, 1, 2}));
  Run(r);
  v1::StepRequest more = Step({Delta(1, 11, {8, 9}, 2, {2, 5})});  // index 2 sent again, 5 new
  ASSERT_TRUE(kv_.ExpandTables(&more).ok());
  EXPECT_EQ(std::vector<int32_t>(more.chunks(0).block_table().begin(), more.chunks(0).block_table().end()),
            (std::vector<int32_t>{0, 1, 2, 5}));
  Run(more);
  // The resent entry must still equal the record: a delta that changes it is refused by Check.
  v1::StepRequest changed = Step({Delta(1, 13, {1}, 1, {9, 2, 5})});
  ASSERT_TRUE(kv_.ExpandTables(&changed).ok());
  EXPECT_NE(Refusal(changed).find("changed at index 1"), std::string::npos);
}

TEST_F(KvOwnershipTest, ADeltaOfAnUnknownGoneOrShortTableIsRefused) {
  auto refused = [&](v1::StepRequest r, const std::string& want) {
    absl::Status st = kv_.ExpandTables(&r);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st.message();
    EXPECT_NE(std::string(st.message()).find(want), std::string::npos) << st.message();
  };
  refused(Step({Delta(2, 0, {1}, 1, {4})}), "no live table");             // never seen
  refused(Step({Delta(1, 10, {1}, 4, {})}), "holds 3 entries");           // past the record
  refused(Step({Delta(1, 10, {1}, -1, {0, 1, 2})}), "from index -1");     // negative
  refused(Step({Delta(1, 10, {1}, 3, {})}, {1}), "no live table");        // released in this step
  refused(Step({Delta(1, 0, {1}, 3, {})}, {}, {1}), "no live table");     // preempted in this step
  // A refusal changes nothing: the sequence's decode as a delta still runs.
  v1::StepRequest ok = Step({Delta(1, 10, {7}, 3, {})});
  ASSERT_TRUE(kv_.ExpandTables(&ok).ok());
  Run(ok);
}

// A chunk whose full table is 100 + i (the full pool's ownership is not under test here).
v1::ChunkProto SlidingChunk(int64_t seq, int64_t start, std::vector<int32_t> tokens, std::vector<int32_t> sliding,
                            std::vector<int32_t> cached_prefix = {}) {
  v1::ChunkProto c = Chunk(seq, start, std::move(tokens), Range(100, static_cast<int32_t>(sliding.size())),
                           std::move(cached_prefix));
  c.mutable_sliding_table()->Add(sliding.begin(), sliding.end());
  return c;
}

class KvOwnershipSlidingTest : public KvOwnershipTest {
 protected:
  static constexpr int kWindow = 6;
  void SetUp() override {
    kv_ = KvOwnership(KvOwnership::Table::kSliding);
    kv_.Reset(kBs, 8, kWindow);
    // Sequence 1: a 10-token prompt in sliding blocks 0, 1, 2.
    Run(Step({SlidingChunk(1, 0, Range(100, 10), {0, 1, 2})}));
  }
};

TEST_F(KvOwnershipSlidingTest, AReleasedBlockMayGoToAnotherSequenceInTheSameStep) {
  Run(Step({SlidingChunk(1, 10, {7}, {0, 1, 2})}));  // sees 5..10: block 0 still held
  // Block 0 is sequence 1's: nobody else may have it while its table names it.
  EXPECT_NE(Refusal(Step({SlidingChunk(2, 0, {1, 2, 3}, {0})})).find("live sequence 1 wrote"), std::string::npos);
  // At 12 the window starts at 7: sequence 1 releases block 0, and sequence 2 takes it.
  Run(Step({SlidingChunk(1, 12, {8}, {-1, 1, 2, 3}), SlidingChunk(2, 0, {1, 2, 3}, {0})}));
  // Now it is sequence 2's: sequence 3 may not have it.
  EXPECT_NE(Refusal(Step({SlidingChunk(3, 0, {1}, {0})})).find("live sequence 2 wrote"), std::string::npos);
  Run(Step({SlidingChunk(1, 13, {9}, {-1, 1, 2, 3})}));
  EXPECT_EQ(kv_.num_live(), 2);
}

TEST_F(KvOwnershipSlidingTest, NoBlockInsideTheWindowAndNoEntryComingBack) {
  Run(Step({SlidingChunk(1, 12, {8}, {-1, 1, 2, 3})}));
  // Position 13 sees 8..13 (blocks 2, 3): block 1 may go, block 2 may not be missing.
  EXPECT_NE(Refusal(Step({SlidingChunk(1, 13, {9}, {-1, -1, -1, 3})})).find("outside the pool"), std::string::npos);
  // A released entry does not come back, whatever block it names.
  EXPECT_NE(Refusal(Step({SlidingChunk(1, 13, {9}, {0, 1, 2, 3})})).find("changed at index 0"), std::string::npos);
  EXPECT_NE(Refusal(Step({SlidingChunk(1, 13, {9}, {5, 1, 2, 3})})).find("changed at index 0"), std::string::npos);
  // Nor may a held entry change to another block.
  EXPECT_NE(Refusal(Step({SlidingChunk(1, 13, {9}, {-1, 1, 6, 3})})).find("changed at index 2"), std::string::npos);
  Run(Step({SlidingChunk(1, 13, {9}, {-1, -1, 2, 3})}));
}

TEST_F(KvOwnershipSlidingTest, ReleasingAnotherSequencesBlockFreesNothing) {
  // Sequence 2 shares sequence 1's blocks 0 and 1 through the prefix cache, then its window
  // leaves block 0. Only the writer's release frees a block: sequence 3 may not have it.
  Run(Step({SlidingChunk(1, 10, Range(110, 6), {0, 1, 2, 3})}));
  Run(Step({SlidingChunk(2, 8, {7, 7}, {0, 1, 4}, Range(100, 8))}));
  Run(Step({SlidingChunk(2, 10, {7, 7}, {0, 1, 4})}));
  EXPECT_NE(Refusal(Step({SlidingChunk(2, 12, {7}, {-1, 1, 4, 5}), SlidingChunk(3, 0, {1}, {0})})).find("live sequence 1 wrote"),
            std::string::npos);
  Run(Step({SlidingChunk(2, 12, {7}, {-1, 1, 4, 5})}));
}

TEST_F(KvOwnershipSlidingTest, APrefixHitStartsWithReleasedEntriesAndSharesTheWindow) {
  // Sequence 1 grows to 16 tokens; a new sequence hits its first 12 (blocks 0..2) and, at 12,
  // reads from 7 on: block 0 is never read (-1), blocks 1 and 2 are shared read-only.
  Run(Step({SlidingChunk(1, 10, Range(110, 6), {0, 1, 2, 3})}));
  const std::vector<int32_t> prefix = Range(100, 12);
  Run(Step({SlidingChunk(4, 12, {42}, {-1, 1, 2, 6}, prefix)}));
  // The same read with a cached prefix that is not what the blocks hold is refused.
  std::vector<int32_t> wrong = prefix;
  wrong[9] = 0;
  EXPECT_NE(Refusal(Step({SlidingChunk(5, 12, {42}, {-1, 1, 2, 7}, wrong)})).find("does not match"), std::string::npos);
}

TEST_F(KvOwnershipSlidingTest, SlidingDeltasExpandFromTheRecordAndTheFullTableIgnoresThem) {
  Run(Step({SlidingChunk(1, 12, {8}, {-1, 1, 2, 3})}));
  v1::StepRequest delta = Step({SlidingChunk(1, 13, {9}, {2, 3})});
  delta.mutable_chunks(0)->set_sliding_table_start(2);
  KvOwnership full;
  full.Reset(kBs, 200);
  ASSERT_TRUE(full.ExpandTables(&delta).ok());  // nothing of the full table is a delta
  EXPECT_EQ(delta.chunks(0).sliding_table_start(), 2);
  ASSERT_TRUE(kv_.ExpandTables(&delta).ok());
  EXPECT_EQ(delta.chunks(0).sliding_table_start(), 0);
  EXPECT_EQ(std::vector<int32_t>(delta.chunks(0).sliding_table().begin(), delta.chunks(0).sliding_table().end()),
            std::vector<int32_t>({-1, 1, 2, 3}));
  Run(delta);
  v1::StepRequest too_far = Step({SlidingChunk(1, 14, {9}, {3})});
  too_far.mutable_chunks(0)->set_sliding_table_start(5);
  EXPECT_FALSE(kv_.ExpandTables(&too_far).ok());
}

TEST(KvOwnershipNoSlidingPoolTest, OneKindModelsSendNoSlidingTable) {
  KvOwnership none(KvOwnership::Table::kSliding);
  none.Reset(kBs, 0, 0);  // the worker's sliding record when the model has one kind of layer
  const v1::StepRequest plain = Step({Chunk(1, 0, Range(100, 10), {0, 1, 2})});
  ASSERT_TRUE(none.Check(plain).ok()) << none.Check(plain);
  none.Commit(plain);
  EXPECT_EQ(none.num_live(), 0);
  const v1::StepRequest with_table = Step({SlidingChunk(2, 0, {1}, {0})});
  EXPECT_NE(none.Check(with_table).message().find("no sliding pool"), std::string::npos);
  v1::StepRequest delta = Step({Chunk(1, 10, {7}, {})});
  delta.mutable_chunks(0)->set_sliding_table_start(3);
  EXPECT_FALSE(none.ExpandTables(&delta).ok());
}

}  // namespace
}  // namespace moeshard
