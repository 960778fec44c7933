// Paged KV block manager with prefix caching. The coordinator owns the block ids; every worker
// maps the same id to its own KV memory, so one table per sequence (per pool) serves all
// workers.
//
// Pools by layer kind. A model whose layers are all of one kind has one pool: the full pool,
// one table per sequence covering every position. A model with both full-attention and
// sliding-window layers (window W: a query at p sees keys p-W+1 .. p) has two: the full pool
// serves the full layers as above, and the sliding pool serves the sliding layers with a
// second table per sequence that holds only the blocks the window can still see. When a
// sequence's step starts at position p (Append's start_pos), every block wholly before
// p - W + 1 goes back to the sliding pool and its table entry becomes -1; entries never come
// back. So a sequence holds at most ceil(W / block_size) + 1 sliding blocks between steps (plus
// the blocks of one chunk during a step), however long it grows. Sliding blocks are reserved
// step by step (Allocate covers the first chunk, Append the next ones); full blocks for the
// whole prompt at admission.
//
// Each block of a pool is used, evictable (cached, idle) or free: coordinator/block_pool.h.
//
// The prefix-cache contracts:
//   match   Allocate() looks up the prompt's full blocks in order, by a chained hash
//           h_i = H(h_{i-1}, tokens of block i). A hit is verified, never trusted: the cached
//           block must hold the same token ids and must have been registered under the very
//           entry matched for block i-1 (entry ids are never reused), so a hash collision or a
//           stale chain is a miss, not wrong KV. Matching stops at the first miss and never
//           covers the whole prompt: at least one token is always left to compute (its logits
//           are needed), so at most (n - 1) / block_size blocks match.
//           With a sliding pool, a hit of L tokens is usable only if the sliding blocks that
//           the first computed position L can see are cached too: those covering
//           [max(0, L - W + 1), L), each cached under the entry of the full block at the same
//           index. The hit is clipped to the longest L (whole blocks) for which they are.
//   lock    a matched block (of either pool) gains a reference and leaves the LRU if it was
//           evictable; a used block is never evicted or rewritten.
//   insert  MarkComputed() registers full blocks whose KV the workers have written. If the
//           hash is already mapped to a block with the same content and chain, that entry is
//           kept (and later blocks chain to it); if it maps to different content (a collision
//           or a stale chain), the newer block replaces it and the older one stops being cached.
//           The sequence's sliding block at the same index is cached under the chain's entry
//           (unless one already is), so the sliding blocks a sequence releases as its window
//           moves on, finishes or is preempted stay reusable until evicted.
//   evict   when a block is needed and none is free, the least recently released evictable
//           block of that pool is taken and its cache entry dropped; evicting (or replacing) a
//           full block drops the sliding block cached under its entry. Free() releases a
//           table's blocks from last to first, so the tail of a prefix is evicted before its head.
//
// Not thread-safe: the coordinator's scheduler owns it and calls it from one thread.
#pragma once

#include <cstdint>
#include <limits>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/block_pool.h"

namespace moeshard {

enum class KvKind { kFull, kSliding };

struct KvPoolStats {
  int64_t total = 0, used = 0, evictable = 0, free = 0;  // used + evictable + free = total
};

class BlockManager {
 public:
  // H(parent hash, tokens of one full block). Replaceable for tests (to force collisions).
  using HashFn = uint64_t (*)(uint64_t parent_hash, const int32_t* tokens, int64_t num_tokens);
  static constexpr int64_t kWholePrompt = std::numeric_limits<int64_t>::max();

  // num_sliding_blocks > 0 and sliding_window > 0: a second pool for sliding-window layers.
  BlockManager(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching, int64_t num_sliding_blocks = 0,
               int64_t sliding_window = 0);

  // Whether Allocate(tokens, first_chunk_tokens) would succeed now for a new sequence.
  bool CanAllocate(const std::vector<int32_t>& tokens, int64_t first_chunk_tokens = kWholePrompt) const;
  // Reserves ceil(tokens.size() / block_size) full blocks for a new sequence, reusing cached
  // blocks for the longest usable prefix of full blocks, and the sliding blocks of the
  // positions [cached - W + 1, cached + first_chunk_tokens) (capped at the prompt). Returns the
  // number of cached tokens (a multiple of block_size, < tokens.size()); their KV need not be
  // computed. Errors: InvalidArgument (no tokens), AlreadyExists (seq_id has blocks),
  // ResourceExhausted (not enough blocks; nothing changes).
  absl::StatusOr<int64_t> Allocate(int64_t seq_id, const std::vector<int32_t>& tokens,
                                   int64_t first_chunk_tokens = kWholePrompt);

  // Whether a step of seq_id over positions [start_pos, new_total_tokens) fits now (false for
  // unknown ids).
  bool CanAppend(int64_t seq_id, int64_t start_pos, int64_t new_total_tokens) const;
  // Makes the tables ready for a step over [start_pos, new_total_tokens): releases the sliding
  // blocks wholly before start_pos - W + 1, then grows both tables to hold new_total_tokens.
  // NotFound for unknown ids; ResourceExhausted if blocks run out (nothing changes).
  absl::Status Append(int64_t seq_id, int64_t start_pos, int64_t new_total_tokens);

  // Registers the full blocks among tokens[0, num_computed) whose KV is now written (tokens
  // is the sequence's whole token list), with their sliding blocks. Idempotent; no-op for
  // unknown ids or when prefix caching is off.
  void MarkComputed(int64_t seq_id, const std::vector<int32_t>& tokens, int64_t num_computed);

  // Releases the sequence's blocks of both pools (no-op for unknown ids).
  void Free(int64_t seq_id);

  // The full-pool block ids of seq_id, position p in block table[p / block_size]. Empty if unknown.
  const std::vector<int32_t>& BlockTable(int64_t seq_id) const;
  // The sliding-pool table (-1: released); empty if unknown or there is one pool.
  const std::vector<int32_t>& SlidingTable(int64_t seq_id) const;
  bool Has(int64_t seq_id) const { return seqs_.count(seq_id) > 0; }

  bool has_sliding_pool() const { return window_ > 0; }
  int64_t sliding_window() const { return window_; }
  // First table index a step starting at start_pos reads in the sliding pool (0 with one pool).
  int64_t FirstSlidingBlock(int64_t start_pos) const;

  // The full pool (the only one of a one-kind model).
  int64_t num_blocks() const { return full_.num_blocks(); }
  int64_t block_size() const { return block_size_; }
  // Full blocks available to new allocations: free + evictable.
  int64_t num_free_blocks() const { return full_.num_available(); }
  int64_t num_evictable_blocks() const { return full_.num_evictable(); }
  // Fraction of full blocks in use (ref_count > 0).
  double Usage() const;
  KvPoolStats Stats(KvKind kind) const;
  // Prompt tokens asked for, and served from the cache, by Allocate() since construction.
  int64_t prefix_query_tokens() const { return prefix_query_tokens_; }
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }

  // Checks every invariant of both pools (ref counts equal table references, free/evictable/
  // used partition the blocks, the hash map and the cached blocks agree, every cached sliding
  // block is keyed by a cached full block's entry, sliding tables are -1 only before their
  // first block). For tests; O(blocks + table sizes).
  absl::Status CheckIntegrity() const;

  // Must be called before the first Allocate().
  void SetHashFnForTesting(HashFn fn) { hash_fn_ = fn; }

 private:
  struct FullMeta {  // of a cached full block (its pool key is the chained hash)
    uint64_t entry = 0;         // unique id of this cache registration (0 = none)
    uint64_t parent_entry = 0;  // entry of the previous block of the chain (0 = first block)
    std::vector<int32_t> tokens;
  };
  struct SeqBlocks {
    std::vector<int32_t> table;
    std::vector<int32_t> sliding;  // -1 before the window
    int64_t num_hashed = 0;        // leading blocks known to the cache (matched or registered)
    uint64_t last_hash = 0;        // chain state after num_hashed blocks
    uint64_t last_entry = 0;
  };
  struct MatchResult {
    std::vector<int32_t> full, sliding;  // sliding: ids for [FirstSlidingBlock(L), m), L = m blocks
    uint64_t hash = 0, entry = 0;
  };

  MatchResult Match(const std::vector<int32_t>& tokens) const;
  int64_t BlocksFor(int64_t num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }
  // Sliding blocks Allocate takes fresh for a prompt of n tokens with `cached` of them hit.
  int64_t NewSlidingBlocks(int64_t n, int64_t cached, int64_t num_hit_sliding, int64_t first_chunk_tokens) const;
  int32_t TakeFull();
  int32_t TakeSliding();
  void UncacheFull(int32_t id);  // and the sliding block keyed on its entry
  // Blocks that releasing sliding entries [0, first) of `sb` would make available.
  int64_t SlidingFreedBy(const SeqBlocks& sb, int64_t first) const;

  int64_t block_size_;
  bool enable_prefix_caching_;
  int64_t window_;
  HashFn hash_fn_;
  BlockPool full_;
  BlockPool sliding_;
  std::vector<FullMeta> meta_;
  std::unordered_map<int64_t, SeqBlocks> seqs_;
  uint64_t next_entry_ = 1;
  int64_t prefix_query_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
};

}  // namespace moeshard
