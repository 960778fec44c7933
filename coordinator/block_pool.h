// One pool of KV block ids with a cache of idle blocks, the building block of BlockManager
// (which holds one pool for full-attention layers and, for models with sliding-window layers,
// a second one for those). Ids are 0 .. num_blocks - 1.
//
// Each block is in exactly one of three states:
//   used       ref_count > 0 (Take or Lock gave it to ref_count tables);
//   evictable  ref_count == 0 and cached under a key: kept in LRU order for a later Lock;
//   free       ref_count == 0 and not cached.
// Take() prefers a free block and otherwise evicts the least recently released evictable one
// (its key is reported so the owner can drop what it keyed on it). Keys are unique: caching a
// block under a key another block holds is the caller's error (Find first).
// Not thread-safe: BlockManager's single caller owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"

namespace moeshard {

class BlockPool {
 public:
  explicit BlockPool(int64_t num_blocks);

  struct Block {
    int32_t ref_count = 0;
    bool cached = false;
    uint64_t key = 0;
    std::list<int32_t>::iterator lru_pos;  // valid while evictable
  };

  // A block for a table (ref_count 1). *evicted_key is set to the key of the block it took
  // from the cache, or left alone when a free block was available. Requires num_available() > 0.
  int32_t Take(bool* evicted, uint64_t* evicted_key);
  // One more table holds `id` (an evictable block leaves the LRU).
  void Lock(int32_t id);
  // One table less holds `id`; at zero it becomes evictable (cached) or free.
  void Release(int32_t id);
  // Registers `id` under `key` (drops its old key first).
  void Cache(int32_t id, uint64_t key);
  // Drops id's key (an evictable block becomes free).
  void Uncache(int32_t id);
  // The block cached under `key`, or -1.
  int32_t Find(uint64_t key) const;

  const Block& block(int32_t id) const { return blocks_[id]; }
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t num_used() const { return num_used_; }
  int64_t num_evictable() const { return static_cast<int64_t>(lru_.size()); }
  int64_t num_cached() const { return static_cast<int64_t>(cache_.size()); }
  // Free + evictable: what Take can hand out.
  int64_t num_available() const { return static_cast<int64_t>(free_.size() + lru_.size()); }

  // ref_count equals refs[id] (the tables' references, counted by the caller), and the
  // free list, LRU, key map and block states agree. `what` names the pool in errors.
  absl::Status CheckIntegrity(const std::vector<int64_t>& refs, const char* what) const;

 private:
  std::vector<Block> blocks_;
  std::deque<int32_t> free_;
  std::list<int32_t> lru_;  // front = evicted first
  std::unordered_map<uint64_t, int32_t> cache_;
  int64_t num_used_ = 0;
};

}  // namespace moeshard
