// PlanKvCopy (worker/kv_copy_plan.h): the compact copy of the blocks a prefill step's queries see.
// Checked by what it must preserve: attention through the plan's tables over a copy gathered by
// its src_blocks equals attention over the pool itself (kernels/cpu Attention), for full and
// sliding-window layers, sliding tables with -1 before the window, and several chunks.
#include "worker/kv_copy_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "kernels/cpu/ops.h"

namespace moeshard {
namespace {

constexpr int64_t kBs = 4, kNkv = 2, kHd = 8, kNq = 4;

struct Pool {
  std::vector<float> k, v;  // [blocks][kBs][kNkv][kHd]
};

Pool RandomPool(int64_t blocks, std::mt19937& rng) {
  std::normal_distribution<float> d;
  Pool p;
  p.k.resize(blocks * kBs * kNkv * kHd);
  p.v.resize(p.k.size());
  for (float& x : p.k) x = d(rng);
  for (float& x : p.v) x = d(rng);
  return p;
}

// A chunk continuing at `start` with n tokens, its table drawn from a shuffled pool; in a
// sliding table the blocks wholly before start - window + 1 are -1.
SeqChunk Chunk(int64_t start, int64_t n, std::vector<int32_t>& free_blocks, int64_t window) {
  SeqChunk ch;
  ch.start_pos = start;
  ch.tokens.assign(n, 1);
  const int64_t nb = (start + n + kBs - 1) / kBs;
  for (int64_t b = 0; b < nb; ++b) {
    ch.block_table.push_back(free_blocks.back());
    free_blocks.pop_back();
  }
  ch.sliding_table = ch.block_table;
  if (window > 0) {
    const int64_t first = std::max<int64_t>(0, start - window + 1);
    for (int64_t b = 0; (b + 1) * kBs <= first; ++b) ch.sliding_table[b] = -1;
  }
  return ch;
}

void ExpectSameAttention(const std::vector<SeqChunk>& batch, int64_t window, bool sliding, const Pool& pool,
                         std::mt19937& rng) {
  absl::StatusOr<KvCopyPlan> plan = PlanKvCopy(batch, kBs, window, sliding);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // The copy, gathered as the GPU kernel does: copy block i <- pool block src_blocks[i].
  const int64_t per_block = kBs * kNkv * kHd;
  std::vector<float> ck(plan->src_blocks.size() * per_block), cv(ck.size());
  for (size_t i = 0; i < plan->src_blocks.size(); ++i) {
    std::copy_n(pool.k.begin() + plan->src_blocks[i] * per_block, per_block, ck.begin() + i * per_block);
    std::copy_n(pool.v.begin() + plan->src_blocks[i] * per_block, per_block, cv.begin() + i * per_block);
  }
  size_t tokens = 0;
  for (const SeqChunk& ch : batch) tokens += ch.tokens.size();
  ASSERT_EQ(plan->table_offset.size(), tokens);
  std::normal_distribution<float> d;
  size_t t = 0;
  for (const SeqChunk& ch : batch) {
    const int64_t n = static_cast<int64_t>(ch.tokens.size());
    std::vector<float> q(n * kNq * kHd), want(q.size()), got(q.size(), -1.f);
    for (float& x : q) x = d(rng);
    const std::vector<int32_t>& table = sliding ? ch.sliding_table : ch.block_table;
    Attention(q.data(), n, kNq, kNkv, kHd, ch.start_pos, PagedKv{pool.k.data(), pool.v.data(), kBs, table.data()},
              window, want.data());
    const int32_t off = plan->table_offset[t];
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(plan->table_offset[t + i], off) << "one offset per chunk";
    Attention(q.data(), n, kNq, kNkv, kHd, ch.start_pos,
              PagedKv{ck.data(), cv.data(), kBs, plan->tables.data() + off}, window, got.data());
    EXPECT_EQ(got, want) << "chunk at " << ch.start_pos << " window " << window;
    t += n;
  }
}

TEST(KvCopyPlanTest, FullLayersCopyEveryBlockOnceInOrder) {
  std::mt19937 rng(7);
  std::vector<int32_t> free_blocks(64);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  std::vector<SeqChunk> batch = {Chunk(0, 9, free_blocks, 0), Chunk(30, 3, free_blocks, 0),
                                 Chunk(5, 12, free_blocks, 0)};
  absl::StatusOr<KvCopyPlan> plan = PlanKvCopy(batch, kBs, 0, false);
  ASSERT_TRUE(plan.ok());
  std::vector<int32_t> all;
  for (const SeqChunk& ch : batch) all.insert(all.end(), ch.block_table.begin(), ch.block_table.end());
  EXPECT_EQ(plan->src_blocks, all);
  EXPECT_EQ(std::count(plan->tables.begin(), plan->tables.end(), -1), 0);
  ExpectSameAttention(batch, 0, false, RandomPool(64, rng), rng);
}

TEST(KvCopyPlanTest, SlidingLayersCopyOnlyTheWindow) {
  std::mt19937 rng(11);
  for (int64_t window : {int64_t{1}, int64_t{3}, int64_t{5}, int64_t{8}, int64_t{13}}) {
    for (bool sliding_tables : {false, true}) {
      std::vector<int32_t> free_blocks(96);
      std::iota(free_blocks.begin(), free_blocks.end(), 0);
      std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
      std::vector<SeqChunk> batch = {Chunk(41, 6, free_blocks, window), Chunk(0, 10, free_blocks, window),
                                     Chunk(17, 1, free_blocks, window), Chunk(64, 20, free_blocks, window)};
      absl::StatusOr<KvCopyPlan> plan = PlanKvCopy(batch, kBs, window, sliding_tables);
      ASSERT_TRUE(plan.ok()) << plan.status();
      // Chunk 0 sees positions [41 - window + 1, 47): its blocks from that one's.
      const int64_t lo = (41 - window + 1) / kBs, hi = 46 / kBs;
      EXPECT_EQ(std::count(plan->tables.begin(), plan->tables.begin() + hi + 1, -1), lo);
      ExpectSameAttention(batch, window, sliding_tables, RandomPool(96, rng), rng);
    }
  }
}

TEST(KvCopyPlanTest, RefusesShortTablesAndMissingBlocks) {
  SeqChunk ch;
  ch.start_pos = 8;
  ch.tokens.assign(5, 1);         // positions 8..12: blocks 0..3 with kBs = 4
  ch.block_table = {3, 4, 5};      // one short
  EXPECT_FALSE(PlanKvCopy({ch}, kBs, 0, false).ok());
  ch.block_table = {3, 4, 5, 6};
  ch.sliding_table = {-1, -1, 7, 8};  // window 6: first key 3 is in block 0, which is gone
  EXPECT_TRUE(PlanKvCopy({ch}, kBs, 0, false).ok());
  EXPECT_FALSE(PlanKvCopy({ch}, kBs, 6, true).ok());
  EXPECT_TRUE(PlanKvCopy({ch}, kBs, 1, true).ok());  // window 1: block 2 onwards
  EXPECT_FALSE(PlanKvCopy({ch}, 0, 0, false).ok());
  EXPECT_FALSE(PlanKvCopy({ch}, kBs, -1, false).ok());
  SeqChunk empty;
  absl::StatusOr<KvCopyPlan> none = PlanKvCopy({empty}, kBs, 0, false);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->src_blocks.empty() && none->table_offset.empty());
}

}  // namespace
}  // namespace moeshard
