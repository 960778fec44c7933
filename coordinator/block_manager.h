// Paged KV block manager with prefix caching. The coordinator owns the block ids; every worker
// maps the same id to its own KV memory, so one table per sequence serves all workers.
//
// Each block is in exactly one of three states:
//   used       ref_count > 0: referenced by the block tables of ref_count live sequences;
//   evictable  ref_count == 0 and cached: holds the KV of a full block that a later prompt may
//              reuse; kept in LRU order;
//   free       ref_count == 0 and not cached.
//
// The prefix-cache contracts:
//   match   Allocate() looks up the prompt's full blocks in order, by a chained hash
//           h_i = H(h_{i-1}, tokens of block i). A hit is verified, never trusted: the cached
//           block must hold the same token ids and must have been registered under the very
//           entry matched for block i-1 (entry ids are never reused), so a hash collision or a
//           stale chain is a miss, not wrong KV. Matching stops at the first miss and never
//           covers the whole prompt: at least one token is always left to compute (its logits
//           are needed), so at most (n - 1) / block_size blocks match.
//   lock    a matched block gains a reference (ref_count + 1) and leaves the LRU if it was
//           evictable; a used block is never evicted or rewritten.
//   insert  MarkComputed() registers full blocks whose KV the workers have written. If the
//           hash is already mapped to a block with the same content and chain, that entry is
//           kept (and later blocks chain to it); if it maps to different content (a collision
//           or a stale chain), the newer block replaces it and the older one stops being cached.
//   evict   when a block is needed and none is free, the least recently released evictable
//           block is taken and its cache entry dropped. Free() releases a table's blocks from
//           last to first, so the tail of a prefix is evicted before its head.
//
// Not thread-safe: the coordinator's scheduler owns it and calls it from one thread.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moeshard {

class BlockManager {
 public:
  // H(parent hash, tokens of one full block). Replaceable for tests (to force collisions).
  using HashFn = uint64_t (*)(uint64_t parent_hash, const int32_t* tokens, int64_t num_tokens);

  BlockManager(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching);

  // Whether Allocate(tokens) would succeed now for a new sequence.
  bool CanAllocate(const std::vector<int32_t>& tokens) const;
  // Reserves ceil(tokens.size() / block_size) blocks for a new sequence, reusing cached blocks
  // for the longest matching prefix of full blocks. Returns the number of cached tokens (a
  // multiple of block_size, < tokens.size()); their KV need not be computed. Errors:
  // InvalidArgument (no tokens), AlreadyExists (seq_id has blocks), ResourceExhausted (not
  // enough blocks; nothing changes).
  absl::StatusOr<int64_t> Allocate(int64_t seq_id, const std::vector<int32_t>& tokens);

  // Whether the table of seq_id can grow to hold new_total_tokens (false for unknown ids).
  bool CanAppend(int64_t seq_id, int64_t new_total_tokens) const;
  // Grows the table to hold new_total_tokens (no-op if it already does). NotFound for unknown
  // ids; ResourceExhausted if blocks run out (nothing changes).
  absl::Status Append(int64_t seq_id, int64_t new_total_tokens);

  // Registers the full blocks among tokens[0, num_computed) whose KV is now written (tokens
  // is the sequence's whole token list). Idempotent; no-op for unknown ids or when prefix
  // caching is off.
  void MarkComputed(int64_t seq_id, const std::vector<int32_t>& tokens, int64_t num_computed);

  // Releases the sequence's blocks (no-op for unknown ids).
  void Free(int64_t seq_id);

  // The block ids of seq_id, position p in block table[p / block_size]. Empty if unknown.
  const std::vector<int32_t>& BlockTable(int64_t seq_id) const;
  bool Has(int64_t seq_id) const { return seqs_.count(seq_id) > 0; }

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t block_size() const { return block_size_; }
  // Blocks available to new allocations: free + evictable.
  int64_t num_free_blocks() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  int64_t num_evictable_blocks() const { return static_cast<int64_t>(lru_.size()); }
  // Fraction of blocks in use (ref_count > 0).
  double Usage() const;
  // Prompt tokens asked for, and served from the cache, by Allocate() since construction.
  int64_t prefix_query_tokens() const { return prefix_query_tokens_; }
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }

  // Checks every invariant (ref counts equal table references, free/evictable/used partition
  // the blocks, the hash map and the cached blocks agree). For tests; O(blocks + table sizes).
  absl::Status CheckIntegrity() const;

  // Must be called before the first Allocate().
  void SetHashFnForTesting(HashFn fn) { hash_fn_ = fn; }

 private:
  struct Block {
    int32_t ref_count = 0;
    bool cached = false;
    uint64_t hash = 0;
    uint64_t entry = 0;         // unique id of this cache registration (0 = none)
    uint64_t parent_entry = 0;  // entry of the previous block of the chain (0 = first block)
    std::vector<int32_t> tokens;
    std::list<int32_t>::iterator lru_pos;  // valid while evictable
  };
  struct SeqBlocks {
    std::vector<int32_t> table;
    int64_t num_hashed = 0;    // leading blocks known to the cache (matched or registered)
    uint64_t last_hash = 0;    // chain state after num_hashed blocks
    uint64_t last_entry = 0;
  };

  // Number of leading full blocks of `tokens` that match the cache (and their ids).
  std::vector<int32_t> Match(const std::vector<int32_t>& tokens, uint64_t* hash, uint64_t* entry) const;
  int64_t BlocksFor(int64_t num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }
  int32_t TakeBlock();             // from the free list, else evicts the LRU head
  void Uncache(int32_t block_id);  // drops the cache entry (moves evictable -> free)
  void Release(int32_t block_id);  // ref_count - 1; to LRU or free list at zero

  int64_t block_size_;
  bool enable_prefix_caching_;
  HashFn hash_fn_;
  std::vector<Block> blocks_;
  std::deque<int32_t> free_;
  std::list<int32_t> lru_;  // front = evicted first
  std::unordered_map<uint64_t, int32_t> cache_;
  std::unordered_map<int64_t, SeqBlocks> seqs_;
  int64_t num_used_ = 0;
  uint64_t next_entry_ = 1;
  int64_t prefix_query_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
};

}  // namespace moeshard
