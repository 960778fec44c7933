#include "coordinator/block_manager.h"

#include <map>
#include <numeric>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/block_test_util.h"

namespace moeshard {
namespace {

using ::testing::ElementsAre;

using testing_blocks::Range;

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(BlockManagerTest, PrefixHitAfterFree) {
  BlockManager bm(10, 4, true);
  const std::vector<int32_t> a = Range(0, 10);  // 2 full blocks + 2 tokens
  ASSERT_EQ(*bm.Allocate(1, a), 0);
  const std::vector<int32_t> table = bm.BlockTable(1);
  ASSERT_EQ(table.size(), 3u);
  bm.MarkComputed(1, a, 10);
  EXPECT_INTEGRITY(bm);
  bm.Free(1);
  EXPECT_EQ(bm.num_free_blocks(), 10);
  EXPECT_EQ(bm.num_evictable_blocks(), 2);
  EXPECT_EQ(bm.Usage(), 0.0);
  EXPECT_INTEGRITY(bm);

  ASSERT_EQ(*bm.Allocate(2, a), 8);
  EXPECT_EQ(bm.BlockTable(2)[0], table[0]);
  EXPECT_EQ(bm.BlockTable(2)[1], table[1]);
  EXPECT_EQ(bm.prefix_query_tokens(), 20);
  EXPECT_EQ(bm.prefix_hit_tokens(), 8);
  EXPECT_DOUBLE_EQ(bm.Usage(), 0.3);
  EXPECT_INTEGRITY(bm);

  // A prompt of exactly two full blocks matches only one: its last token must be computed.
  bm.Free(2);
  ASSERT_EQ(*bm.Allocate(3, Range(0, 8)), 4);
  EXPECT_INTEGRITY(bm);
}

TEST(BlockManagerTest, PartialBlockPrompts) {
  BlockManager bm(10, 4, true);
  const std::vector<int32_t> p = {5, 6, 7, 8, 9, 10};  // one full block, one partial
  ASSERT_EQ(*bm.Allocate(1, p), 0);
  bm.MarkComputed(1, p, 6);
  bm.Free(1);
  EXPECT_EQ(bm.num_evictable_blocks(), 1);  // the partial block is not cached
  EXPECT_EQ(*bm.Allocate(2, {5, 6, 7, 8, 99, 98, 97}), 4);  // diverges in block 1
  EXPECT_EQ(*bm.Allocate(3, {5, 6, 7, 8, 9}), 4);           // (5 - 1) / 4 = 1 block may match
  EXPECT_EQ(*bm.Allocate(4, {5, 6, 7, 9, 9}), 0);           // diverges in block 0
  EXPECT_EQ(*bm.Allocate(5, {5, 6, 7, 8}), 0);              // only a full block: nothing to compute
  EXPECT_INTEGRITY(bm);
}

TEST(BlockManagerTest, MarkComputedIsIncrementalAndIdempotent) {
  BlockManager bm(10, 2, true);
  const std::vector<int32_t> t = Range(0, 7);
  ASSERT_TRUE(bm.Allocate(1, t).ok());
  bm.MarkComputed(1, t, 3);  // one full block
  bm.MarkComputed(1, t, 3);
  bm.MarkComputed(1, t, 1);
  EXPECT_INTEGRITY(bm);
  EXPECT_EQ(*bm.Allocate(2, t), 2);
  bm.MarkComputed(1, t, 7);  // three full blocks
  EXPECT_EQ(*bm.Allocate(3, t), 6);
  EXPECT_INTEGRITY(bm);
}

// Hashes only the block's own tokens: every chain with the same block content collides.
uint64_t ContentOnlyHash(uint64_t, const int32_t* t, int64_t n) {
  uint64_t h = 7;
  for (int64_t i = 0; i < n; ++i) h = h * 31 + t[i];
  return h;
}
uint64_t ConstantHash(uint64_t, const int32_t*, int64_t) { return 42; }
uint64_t WeakHash(uint64_t parent, const int32_t* t, int64_t n) {
  uint64_t s = parent;
  for (int64_t i = 0; i < n; ++i) s += t[i];
  return s % 5;
}

TEST(BlockManagerTest, CollisionsAreMissesNotWrongHits) {
  {
    BlockManager bm(10, 2, true);
    bm.SetHashFnForTesting(&ConstantHash);
    ASSERT_EQ(*bm.Allocate(1, {1, 2, 3}), 0);
    bm.MarkComputed(1, {1, 2, 3}, 3);
    bm.Free(1);
    EXPECT_EQ(*bm.Allocate(2, {4, 5, 6}), 0);  // same hash, different tokens
    EXPECT_EQ(*bm.Allocate(3, {1, 2, 6}), 2);  // true match still works
    EXPECT_INTEGRITY(bm);
  }
  // Same block content under a different parent: the chain check rejects it.
  BlockManager bm(10, 2, true);
  bm.SetHashFnForTesting(&ContentOnlyHash);
  const std::vector<int32_t> x = {1, 1, 2, 2, 0};  // blocks [1 1] [2 2]
  const std::vector<int32_t> y = {3, 3, 2, 2, 0};  // blocks [3 3] [2 2]
  ASSERT_EQ(*bm.Allocate(1, x), 0);
  bm.MarkComputed(1, x, 5);
  ASSERT_EQ(*bm.Allocate(2, y), 0);
  bm.MarkComputed(2, y, 5);  // [2 2] under [3 3] replaces the entry for [2 2] under [1 1]
  EXPECT_INTEGRITY(bm);
  EXPECT_EQ(*bm.Allocate(3, x), 2);  // only [1 1]; never y's [2 2] block
  EXPECT_NE(bm.BlockTable(3)[1], bm.BlockTable(2)[1]);
  EXPECT_EQ(*bm.Allocate(4, y), 4);
  EXPECT_INTEGRITY(bm);
}

TEST(BlockManagerTest, LruEvictionOrder) {
  BlockManager bm(6, 2, true);
  std::map<char, int32_t> cached_block;
  int64_t id = 0;
  for (char name : {'A', 'B', 'C'}) {  // each leaves one cached block behind
    const std::vector<int32_t> t = {name, name, 0};
    ASSERT_TRUE(bm.Allocate(++id, t).ok());
    cached_block[name] = bm.BlockTable(id)[0];
    bm.MarkComputed(id, t, 3);
    bm.Free(id);
  }
  EXPECT_EQ(bm.num_evictable_blocks(), 3);
  ASSERT_EQ(*bm.Allocate(++id, {'B', 'B', 1}), 2);  // touch B: LRU order becomes A, C, B
  bm.Free(id);
  EXPECT_INTEGRITY(bm);
  // The 3 free blocks go first, then evictions in LRU order: A, then C.
  ASSERT_TRUE(bm.Allocate(100, Range(100, 106)).ok());
  for (int32_t b : bm.BlockTable(100)) {
    EXPECT_TRUE(b != cached_block['A'] && b != cached_block['B'] && b != cached_block['C']) << b;
  }
  ASSERT_TRUE(bm.Append(100, 0, 8).ok());
  EXPECT_EQ(bm.BlockTable(100).back(), cached_block['A']);
  ASSERT_TRUE(bm.Append(100, 0, 10).ok());
  EXPECT_EQ(bm.BlockTable(100).back(), cached_block['C']);
  EXPECT_EQ(bm.num_evictable_blocks(), 1);
  EXPECT_INTEGRITY(bm);
  bm.Free(100);
  EXPECT_EQ(*bm.Allocate(101, {'B', 'B', 0}), 2);  // B survived
  EXPECT_EQ(*bm.Allocate(102, {'A', 'A', 0}), 0);  // A and C were evicted
  EXPECT_EQ(*bm.Allocate(103, {'C', 'C', 0}), 0);
  EXPECT_INTEGRITY(bm);
}

TEST(BlockManagerTest, FreeReleasesTailFirst) {
  BlockManager bm(4, 2, true);
  const std::vector<int32_t> t = {1, 2, 3, 4, 5};  // blocks [1 2] [3 4] [5]
  ASSERT_TRUE(bm.Allocate(1, t).ok());
  const std::vector<int32_t> table = bm.BlockTable(1);
  bm.MarkComputed(1, t, 5);
  bm.Free(1);
  ASSERT_TRUE(bm.Allocate(2, {9, 9, 9, 9, 9}).ok());  // 3 blocks: 2 free, then evicts [3 4]
  EXPECT_EQ(bm.BlockTable(2)[2], table[1]);
  bm.Free(2);
  EXPECT_EQ(*bm.Allocate(3, {1, 2, 3}), 2);  // the head [1 2] is still cached
  EXPECT_INTEGRITY(bm);
}

TEST(BlockManagerTest, RefcountSharingBetweenLiveSequences) {
  BlockManager bm(10, 4, true);
  const std::vector<int32_t> a = Range(0, 9);
  ASSERT_TRUE(bm.Allocate(1, a).ok());
  bm.MarkComputed(1, a, 9);
  const std::vector<int32_t> b = Concat(Range(0, 8), {77, 78});
  ASSERT_EQ(*bm.Allocate(2, b), 8);
  EXPECT_EQ(bm.BlockTable(2)[0], bm.BlockTable(1)[0]);
  EXPECT_EQ(bm.BlockTable(2)[1], bm.BlockTable(1)[1]);
  EXPECT_NE(bm.BlockTable(2)[2], bm.BlockTable(1)[2]);
  EXPECT_DOUBLE_EQ(bm.Usage(), 0.4);  // 3 + 1 distinct blocks
  EXPECT_INTEGRITY(bm);
  bm.Free(1);
  EXPECT_EQ(bm.num_free_blocks(), 7);  // shared blocks stay with sequence 2
  EXPECT_EQ(bm.num_evictable_blocks(), 0);
  EXPECT_INTEGRITY(bm);
  bm.Free(2);
  EXPECT_EQ(bm.num_free_blocks(), 10);
  EXPECT_EQ(bm.num_evictable_blocks(), 2);
  EXPECT_INTEGRITY(bm);
}

TEST(BlockManagerTest, DuplicateComputationKeepsOneEntryAndChainsThroughIt) {
  BlockManager bm(12, 4, true);
  const std::vector<int32_t> p = Range(0, 9);
  const std::vector<int32_t> longer = Concat(p, {9, 10, 11, 12});  // 3 full blocks + 1
  ASSERT_EQ(*bm.Allocate(1, p), 0);
  ASSERT_EQ(*bm.Allocate(2, longer), 0);  // nothing computed yet: both miss
  bm.MarkComputed(1, p, 9);
  bm.MarkComputed(2, longer, 13);  // blocks 0, 1 already cached by 1; block 2 chains to them
  EXPECT_INTEGRITY(bm);
  const std::vector<int32_t> t1 = bm.BlockTable(1), t2 = bm.BlockTable(2);
  bm.Free(1);
  bm.Free(2);
  EXPECT_EQ(bm.num_evictable_blocks(), 3);
  ASSERT_EQ(*bm.Allocate(3, Concat(longer, {5})), 12);
  EXPECT_THAT(bm.BlockTable(3), ElementsAre(t1[0], t1[1], t2[2], ::testing::_));
  EXPECT_INTEGRITY(bm);
}

TEST(BlockManagerTest, ErrorsAndAppend) {
  BlockManager bm(3, 4, true);
  EXPECT_EQ(bm.Allocate(1, {}).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(bm.Allocate(1, {1, 2}).ok());
  EXPECT_EQ(bm.Allocate(1, {1, 2}).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(bm.Append(9, 0, 4).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(bm.CanAppend(9, 0, 1));
  EXPECT_TRUE(bm.Append(1, 0, 4).ok());  // still one block
  EXPECT_EQ(bm.BlockTable(1).size(), 1u);
  EXPECT_TRUE(bm.CanAppend(1, 0, 12));
  EXPECT_FALSE(bm.CanAppend(1, 0, 13));
  EXPECT_EQ(bm.Append(1, 0, 13).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(bm.BlockTable(1).size(), 1u);  // unchanged
  EXPECT_FALSE(bm.CanAllocate(Range(0, 9)));
  EXPECT_EQ(bm.Allocate(2, Range(0, 9)).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(bm.Has(2));
  EXPECT_EQ(bm.num_free_blocks(), 2);
  EXPECT_TRUE(bm.BlockTable(2).empty());
  bm.Free(2);  // unknown: no-op
  EXPECT_INTEGRITY(bm);
}

TEST(BlockManagerTest, PrefixCachingOff) {
  BlockManager bm(10, 2, false);
  const std::vector<int32_t> t = Range(0, 7);
  ASSERT_EQ(*bm.Allocate(1, t), 0);
  bm.MarkComputed(1, t, 7);
  bm.Free(1);
  EXPECT_EQ(bm.num_evictable_blocks(), 0);
  EXPECT_EQ(*bm.Allocate(2, t), 0);
  EXPECT_EQ(bm.prefix_hit_tokens(), 0);
  EXPECT_INTEGRITY(bm);
}

// Randomized: allocate / append / compute / free, with a model of what KV each block holds.
// Every cache hit must serve blocks whose written KV is exactly the new prompt's prefix.
void Simulate(BlockManager::HashFn hash, uint32_t seed, bool expect_hits) {
  constexpr int64_t kBlocks = 32, kBs = 4;
  BlockManager bm(kBlocks, kBs, true);
  if (hash != nullptr) bm.SetHashFnForTesting(hash);
  std::mt19937 rng(seed);
  auto rnd = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  std::vector<std::vector<int32_t>> bases(3);
  for (auto& b : bases) {
    for (int i = 0; i < 24; ++i) b.push_back(static_cast<int32_t>(rnd(0, 3)));
  }
  struct Live {
    std::vector<int32_t> tokens;
    int64_t computed = 0, cached_blocks = 0;
  };
  std::map<int64_t, Live> live;
  std::map<int32_t, std::vector<int32_t>> written;  // block -> the prefix whose KV it holds
  int64_t next_id = 0, hits = 0;
  for (int op = 0; op < 4000; ++op) {
    const int64_t kind = rnd(0, 9);
    if (kind < 3 || live.empty()) {
      const std::vector<int32_t>& base = bases[rnd(0, 2)];
      std::vector<int32_t> t(base.begin(), base.begin() + rnd(1, 24));
      for (int64_t i = rnd(0, 6); i > 0; --i) t.push_back(static_cast<int32_t>(rnd(0, 3)));
      const bool can = bm.CanAllocate(t);
      absl::StatusOr<int64_t> cached = bm.Allocate(++next_id, t);
      ASSERT_EQ(can, cached.ok());
      if (cached.ok()) {
        ASSERT_EQ(*cached % kBs, 0);
        ASSERT_LT(*cached, static_cast<int64_t>(t.size()));
        const std::vector<int32_t>& table = bm.BlockTable(next_id);
        ASSERT_EQ(static_cast<int64_t>(table.size()), (static_cast<int64_t>(t.size()) + kBs - 1) / kBs);
        for (int64_t i = 0; i < *cached / kBs; ++i) {
          ASSERT_TRUE(written.count(table[i])) << "hit on a block never written";
          ASSERT_EQ(written[table[i]], std::vector<int32_t>(t.begin(), t.begin() + (i + 1) * kBs));
        }
        for (size_t i = *cached / kBs; i < table.size(); ++i) written.erase(table[i]);
        hits += *cached > 0;
        live[next_id] = {t, *cached, *cached / kBs};
      } else {
        ASSERT_EQ(cached.status().code(), absl::StatusCode::kResourceExhausted);
      }
    } else {
      auto it = std::next(live.begin(), rnd(0, live.size() - 1));
      Live& s = it->second;
      if (kind < 5) {  // grow
        std::vector<int32_t> extra(rnd(1, 6));
        for (auto& x : extra) x = static_cast<int32_t>(rnd(0, 3));
        const int64_t total = s.tokens.size() + extra.size();
        const size_t before = bm.BlockTable(it->first).size();
        const bool can = bm.CanAppend(it->first, 0, total);
        ASSERT_EQ(bm.Append(it->first, 0, total).ok(), can);
        if (can) {
          s.tokens.insert(s.tokens.end(), extra.begin(), extra.end());
          const std::vector<int32_t>& table = bm.BlockTable(it->first);
          for (size_t i = before; i < table.size(); ++i) written.erase(table[i]);
        }
      } else if (kind < 8) {  // the workers write KV up to some point
        const int64_t to = rnd(s.computed, s.tokens.size());
        const std::vector<int32_t>& table = bm.BlockTable(it->first);
        for (int64_t i = s.cached_blocks; i < to / kBs; ++i) {
          written[table[i]] = std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + (i + 1) * kBs);
        }
        s.computed = to;
        bm.MarkComputed(it->first, s.tokens, to);
      } else {
        bm.Free(it->first);
        live.erase(it);
      }
    }
    absl::Status st = bm.CheckIntegrity();
    ASSERT_TRUE(st.ok()) << "op " << op << ": " << st;
    int64_t held = 0;
    for (const auto& [id, s] : live) held += bm.BlockTable(id).size();
    ASSERT_LE(bm.Usage() * kBlocks, held + 1e-9);
    ASSERT_GE(bm.num_free_blocks(), kBlocks - held);
  }
  if (expect_hits) {
    EXPECT_GT(hits, 50);
  }
}

TEST(BlockManagerTest, RandomizedDefaultHash) { Simulate(nullptr, 1, true); }
TEST(BlockManagerTest, RandomizedWeakHash) { Simulate(&WeakHash, 2, false); }
TEST(BlockManagerTest, RandomizedContentOnlyHash) { Simulate(&ContentOnlyHash, 3, true); }
TEST(BlockManagerTest, RandomizedConstantHash) { Simulate(&ConstantHash, 4, false); }

}  // namespace
}  // namespace moeshard
