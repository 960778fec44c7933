// BlockManager with two pools (full-attention and sliding-window layers): the window's
// release, prefix hits clipped to what the sliding pool still caches, eviction of either kind,
// and a randomized run against a model of what KV each block of each pool holds.
#include <map>
#include <numeric>
#include <random>

#include "coordinator/block_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/block_test_util.h"

namespace moeshard {
namespace {

using ::testing::ElementsAre;

using testing_blocks::Range;

std::vector<int32_t> Head(const std::vector<int32_t>& v, int64_t n, int32_t then) {
  std::vector<int32_t> h(v.begin(), v.begin() + n);
  h.push_back(then);
  return h;
}

TEST(BlockManagerSlidingTest, OnePoolWithoutAWindow) {
  BlockManager bm(8, 4, true, 8, 0);  // no window: one pool, as before
  EXPECT_FALSE(bm.has_sliding_pool());
  ASSERT_EQ(*bm.Allocate(1, Range(0, 10)), 0);
  EXPECT_TRUE(bm.SlidingTable(1).empty());
  EXPECT_EQ(bm.Stats(KvKind::kSliding).total, 0);
  EXPECT_INTEGRITY(bm);
}

TEST(BlockManagerSlidingTest, WindowReleasesBlocksAndUsageStaysFlat) {
  constexpr int64_t kBs = 4, kWindow = 8;
  BlockManager bm(64, kBs, true, 8, kWindow);
  const std::vector<int32_t> t = Range(0, 200);
  ASSERT_EQ(*bm.Allocate(1, Head(t, 9, 9)), 0);  // prompt of 10: 3 blocks in both pools
  EXPECT_EQ(bm.SlidingTable(1).size(), 3u);
  bm.MarkComputed(1, t, 10);
  ASSERT_TRUE(bm.Append(1, 10, 11).ok());  // sees 3..10: block 0 still in the window
  EXPECT_EQ(bm.SlidingTable(1)[0] >= 0, true);
  ASSERT_TRUE(bm.Append(1, 12, 13).ok());  // sees 5..12: block 0 (0..3) released
  EXPECT_EQ(bm.SlidingTable(1)[0], -1);
  EXPECT_GE(bm.SlidingTable(1)[1], 0);
  EXPECT_EQ(bm.Stats(KvKind::kSliding).used, 3);  // blocks 1..3
  EXPECT_INTEGRITY(bm);
  int64_t max_sliding = 0;
  for (int64_t p = 13; p < 200; ++p) {
    ASSERT_TRUE(bm.Append(1, p, p + 1).ok()) << p;
    bm.MarkComputed(1, t, p + 1);
    max_sliding = std::max(max_sliding, bm.Stats(KvKind::kSliding).used);
    ASSERT_EQ(bm.Stats(KvKind::kFull).used, (p + 1 + kBs - 1) / kBs);  // the full pool grows
  }
  EXPECT_LE(max_sliding, kWindow / kBs + 1);  // flat: ceil(W / bs) + 1
  EXPECT_EQ(bm.SlidingTable(1).size(), 50u);
  EXPECT_EQ(bm.SlidingTable(1)[47], -1);  // the step at 199 sees 192 .. 199: blocks 48, 49
  EXPECT_GE(bm.SlidingTable(1)[48], 0);
  EXPECT_INTEGRITY(bm);
  bm.Free(1);
  EXPECT_EQ(bm.Stats(KvKind::kSliding).used, 0);
  EXPECT_EQ(bm.Stats(KvKind::kSliding).evictable + bm.Stats(KvKind::kSliding).free, 8);
  EXPECT_INTEGRITY(bm);
}

TEST(BlockManagerSlidingTest, FirstChunkOnlyReservesItsSlidingBlocks) {
  BlockManager bm(64, 4, true, 16, 8);
  ASSERT_EQ(*bm.Allocate(1, Range(0, 100), 12), 0);  // a 100-token prompt, first chunk of 12
  EXPECT_EQ(bm.BlockTable(1).size(), 25u);
  EXPECT_EQ(bm.SlidingTable(1).size(), 3u);
  ASSERT_TRUE(bm.Append(1, 12, 24).ok());  // the next chunk sees 5..23: block 0 goes
  EXPECT_EQ(bm.SlidingTable(1).size(), 6u);
  EXPECT_EQ(bm.SlidingTable(1)[0], -1);
  EXPECT_EQ(bm.Stats(KvKind::kSliding).used, 5);
  // A chunk the sliding pool cannot hold is refused whole.
  EXPECT_FALSE(bm.CanAppend(1, 24, 24 + 64));
  EXPECT_EQ(bm.Append(1, 24, 24 + 64).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(bm.SlidingTable(1).size(), 6u);
  EXPECT_INTEGRITY(bm);
}

// Prompt p (20 tokens, 5 blocks of 4; window 4: a query at L sees L-3 .. L): its sliding blocks
// are cached as it computes them and stay cached after the window moves past them.
TEST(BlockManagerSlidingTest, HitStaysWholeOrIsClippedToCachedSlidingBlocks) {
  BlockManager bm(32, 4, true, 8, 4);
  const std::vector<int32_t> p = Range(100, 121);
  ASSERT_EQ(*bm.Allocate(1, Range(100, 120)), 0);
  const std::vector<int32_t> first = bm.SlidingTable(1);
  bm.MarkComputed(1, p, 20);
  ASSERT_TRUE(bm.Append(1, 20, 21).ok());  // sees 17..20: blocks 0..3 released (LRU: 3, 2, 1, 0)
  EXPECT_THAT(bm.SlidingTable(1), ElementsAre(-1, -1, -1, -1, first[4], ::testing::_));
  EXPECT_EQ(bm.Stats(KvKind::kSliding).evictable, 4);
  EXPECT_INTEGRITY(bm);

  // A hit of 12 tokens needs the sliding block of 9..11 (block 2): cached, so it stays whole,
  // and shares the cached sliding block with no copy.
  ASSERT_EQ(*bm.Allocate(2, Head(p, 12, 7)), 12);
  EXPECT_THAT(bm.SlidingTable(2), ElementsAre(-1, -1, first[2], ::testing::_));
  bm.Free(2);
  EXPECT_INTEGRITY(bm);

  // An unrelated sequence takes the 2 free sliding blocks and evicts the oldest released one
  // (block 3). Its full block stays cached.
  ASSERT_EQ(*bm.Allocate(3, Range(500, 512)), 0);
  EXPECT_EQ(bm.Stats(KvKind::kSliding).evictable, 3);
  EXPECT_EQ(bm.Stats(KvKind::kFull).evictable, 0);  // p's blocks are all held by sequence 1
  // A hit of 16 tokens needs block 3's sliding KV (13..15): gone, so the hit is clipped to 12.
  ASSERT_EQ(*bm.Allocate(4, Head(p, 16, 7)), 12);
  EXPECT_EQ(bm.BlockTable(4)[2], bm.BlockTable(1)[2]);
  EXPECT_NE(bm.BlockTable(4)[3], bm.BlockTable(1)[3]);  // recomputed into its own block
  EXPECT_THAT(bm.SlidingTable(4), ElementsAre(-1, -1, first[2], ::testing::_, ::testing::_));
  EXPECT_EQ(bm.prefix_hit_tokens(), 24);
  EXPECT_INTEGRITY(bm);
  // Recomputing block 3 caches its sliding block again under the same chain: whole hits again.
  bm.MarkComputed(4, Head(p, 16, 7), 16);
  bm.Free(4);
  ASSERT_EQ(*bm.Allocate(5, Head(p, 16, 8)), 16);
  EXPECT_INTEGRITY(bm);
}

TEST(BlockManagerSlidingTest, EvictingAFullBlockDropsItsSlidingBlock) {
  BlockManager bm(4, 4, true, 8, 4);
  const std::vector<int32_t> p = Range(0, 9);
  ASSERT_EQ(*bm.Allocate(1, p), 0);  // 3 full blocks, 3 sliding
  bm.MarkComputed(1, p, 9);
  bm.Free(1);
  EXPECT_EQ(bm.Stats(KvKind::kFull).evictable, 2);
  EXPECT_EQ(bm.Stats(KvKind::kSliding).evictable, 2);
  EXPECT_INTEGRITY(bm);
  // 4 full blocks: takes the free one, then evicts both cached full blocks (tail first), and
  // with each its sliding block; the sliding pool itself had room.
  ASSERT_EQ(*bm.Allocate(2, Range(50, 63)), 0);
  EXPECT_EQ(bm.Stats(KvKind::kFull).evictable, 0);
  EXPECT_EQ(bm.Stats(KvKind::kSliding).evictable, 0);
  EXPECT_EQ(bm.Stats(KvKind::kSliding).free, 4);
  EXPECT_INTEGRITY(bm);
  bm.Free(2);
  EXPECT_EQ(*bm.Allocate(3, p), 0);  // nothing of p is cached any more
  EXPECT_INTEGRITY(bm);
}

TEST(BlockManagerSlidingTest, AdmissionCountsBothPools) {
  BlockManager bm(64, 4, true, 5, 8);  // the sliding pool holds 5 blocks
  EXPECT_TRUE(bm.CanAllocate(Range(0, 100), 12));   // 3 sliding blocks for the first chunk
  EXPECT_FALSE(bm.CanAllocate(Range(0, 100), 24));  // 6
  ASSERT_EQ(*bm.Allocate(1, Range(0, 100), 12), 0);
  EXPECT_FALSE(bm.CanAllocate(Range(0, 20), 12));   // 3 more do not fit
  EXPECT_EQ(bm.Allocate(2, Range(0, 20), 12).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(bm.Has(2));
  EXPECT_TRUE(bm.CanAllocate(Range(0, 20), 8));
  EXPECT_INTEGRITY(bm);
}

// Randomized: sequences admitted with a random first chunk, stepped in random chunks, computed,
// freed; a model of the prefix whose KV each block of each pool holds. Every hit must serve
// full blocks and the window's sliding blocks holding exactly the new prompt's prefix.
TEST(BlockManagerSlidingTest, RandomizedAgainstAModelOfTheKv) {
  constexpr int64_t kBs = 4, kWindow = 6;
  BlockManager bm(48, kBs, true, 24, kWindow);
  std::mt19937 rng(7);
  auto rnd = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  std::vector<std::vector<int32_t>> bases(3);
  for (auto& b : bases) {
    for (int i = 0; i < 40; ++i) b.push_back(static_cast<int32_t>(rnd(0, 2)));
  }
  struct Live {
    std::vector<int32_t> tokens;
    int64_t computed = 0;
  };
  std::map<int64_t, Live> live;
  std::map<int32_t, std::vector<int32_t>> full_kv, sliding_kv;  // block -> the prefix its KV is of
  auto forget_new = [](std::map<int32_t, std::vector<int32_t>>& kv, const std::vector<int32_t>& table, size_t from) {
    for (size_t i = from; i < table.size(); ++i) {
      if (table[i] >= 0) kv.erase(table[i]);
    }
  };
  int64_t next_id = 0, hits = 0, clipped = 0;
  for (int op = 0; op < 5000; ++op) {
    const int64_t kind = rnd(0, 9);
    if (kind < 3 || live.empty()) {
      const std::vector<int32_t>& base = bases[rnd(0, 2)];
      std::vector<int32_t> t(base.begin(), base.begin() + rnd(1, 40));
      for (int64_t i = rnd(0, 3); i > 0; --i) t.push_back(static_cast<int32_t>(rnd(0, 2)));
      const int64_t chunk = rnd(1, 12);
      const bool can = bm.CanAllocate(t, chunk);
      absl::StatusOr<int64_t> cached = bm.Allocate(++next_id, t, chunk);
      ASSERT_EQ(can, cached.ok());
      if (!cached.ok()) continue;
      const std::vector<int32_t>& table = bm.BlockTable(next_id);
      const std::vector<int32_t>& sliding = bm.SlidingTable(next_id);
      const int64_t m = *cached / kBs;
      for (int64_t i = 0; i < m; ++i) {
        const std::vector<int32_t> prefix(t.begin(), t.begin() + (i + 1) * kBs);
        ASSERT_EQ(full_kv[table[i]], prefix) << "full hit on a block of other KV";
        if (i >= bm.FirstSlidingBlock(*cached)) {
          ASSERT_EQ(sliding_kv[sliding[i]], prefix) << "sliding hit on other KV";
        } else {
          ASSERT_EQ(sliding[i], -1);
        }
      }
      forget_new(full_kv, table, m);
      forget_new(sliding_kv, sliding, m);
      hits += m > 0;
      clipped += (static_cast<int64_t>(t.size()) - 1) / kBs > m;
      live[next_id] = {t, *cached};
      continue;
    }
    auto it = std::next(live.begin(), rnd(0, live.size() - 1));
    Live& s = it->second;
    if (kind < 8) {  // a step: grow (decode) or run the next prompt chunk, then compute it
      if (s.computed == static_cast<int64_t>(s.tokens.size())) s.tokens.push_back(static_cast<int32_t>(rnd(0, 2)));
      const int64_t end = std::min<int64_t>(s.tokens.size(), s.computed + rnd(1, 8));
      const size_t before_full = bm.BlockTable(it->first).size(), before_sliding = bm.SlidingTable(it->first).size();
      const bool can = bm.CanAppend(it->first, s.computed, end);
      ASSERT_EQ(bm.Append(it->first, s.computed, end).ok(), can);
      if (!can) continue;
      forget_new(full_kv, bm.BlockTable(it->first), before_full);
      forget_new(sliding_kv, bm.SlidingTable(it->first), before_sliding);
      const std::vector<int32_t>& sliding = bm.SlidingTable(it->first);
      for (int64_t i = 0; i < bm.FirstSlidingBlock(s.computed); ++i) ASSERT_EQ(sliding[i], -1);
      for (int64_t i = bm.FirstSlidingBlock(s.computed); i < (end + kBs - 1) / kBs; ++i) ASSERT_GE(sliding[i], 0);
      for (int64_t i = s.computed / kBs; i < end / kBs; ++i) {
        const std::vector<int32_t> prefix(s.tokens.begin(), s.tokens.begin() + (i + 1) * kBs);
        full_kv[bm.BlockTable(it->first)[i]] = prefix;
        sliding_kv[sliding[i]] = prefix;
      }
      s.computed = end;
      bm.MarkComputed(it->first, s.tokens, end);
    } else {
      bm.Free(it->first);
      live.erase(it);
    }
    const absl::Status st = bm.CheckIntegrity();
    ASSERT_TRUE(st.ok()) << "op " << op << ": " << st;
    for (const auto& [id, l] : live) {
      int64_t held = 0;
      for (int32_t b : bm.SlidingTable(id)) held += b >= 0;
      ASSERT_LE(held, (kWindow - 1 + 8 + kBs - 1) / kBs + 2) << "sequence " << id;
    }
  }
  EXPECT_GT(hits, 100);
  EXPECT_GT(clipped, 10);
}

}  // namespace
}  // namespace moeshard
