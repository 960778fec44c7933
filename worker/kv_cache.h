// Paged KV cache of one worker: for each of its layers, K and V in fp32 as
// [num_blocks, block_size, num_local_kv_heads, head_dim]. With a sliding pool, the
// sliding-window layers hold num_sliding_blocks blocks each (their own ids, from the sequence's
// sliding table) and the others num_blocks. Block ids are handed out by
// the owner of the block table (the coordinator's block manager, or BlockAllocator for a
// single process); position p of a sequence lives in block table[p / block_size].
// Not thread-safe; one forward pass at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace moeshard {

class KvCache {
 public:
  // in_sliding_pool[l]: layer l holds num_sliding_blocks blocks (empty: every layer num_blocks).
  KvCache(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads, int64_t head_dim,
          const std::vector<bool>& in_sliding_pool = {}, int64_t num_sliding_blocks = 0);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  float* k(int64_t layer) { return k_[layer].data(); }
  float* v(int64_t layer) { return v_[layer].data(); }
  size_t bytes() const;

  // Stores k/v [T, kv_heads, head_dim] of positions pos0 .. pos0+T-1.
  absl::Status Write(int64_t layer, const std::vector<int32_t>& block_table, int64_t pos0, int64_t T,
                     const float* k, const float* v);

 private:
  int64_t num_blocks_, block_size_, slot_;
  std::vector<std::vector<float>> k_, v_;
};

// Hands out block ids for single-process use (generate, check, tests).
class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t num_blocks);
  // Grows `table` to cover `num_positions`; ResourceExhausted when blocks run out.
  absl::Status Reserve(std::vector<int32_t>& table, int64_t num_positions, int64_t block_size);
  // A sliding table before a step at start_pos: frees the blocks wholly before its window
  // (start_pos - window + 1) and sets their entries to -1 (BlockManager's rule, in one process).
  void ReleaseBeforeWindow(std::vector<int32_t>& table, int64_t start_pos, int64_t window, int64_t block_size);
  void Free(std::vector<int32_t>& table);  // skips -1 entries
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }

 private:
  std::vector<int32_t> free_;
};

}  // namespace moeshard
