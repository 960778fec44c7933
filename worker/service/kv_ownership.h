// Which KV blocks each live sequence may touch, as the worker saw the steps that wrote them.
// The coordinator owns the block ids; a step whose block table names KV blocks of another
// live sequence is refused, so that a buggy or compromised coordinator path cannot read
// (or overwrite) another request's KV.
//
// The bookkeeping:
//   writer   every block remembers the sequence that last wrote it; a sequence is live from
//            its first chunk until a step lists it in released_seqs or preempted_seqs.
//   own      a chunk may read and write blocks it wrote itself, and blocks whose writer is
//            not live (free or prefix-cached blocks of finished sequences).
//   shared   a new sequence (one the worker does not know, or one preempted since) that starts
//            at start_pos > 0 reads the first start_pos / block_size blocks of its table
//            without writing them: the prefix cache's hit. Those blocks may belong to another
//            live sequence only when the chunk's cached_prefix holds the tokens they were
//            written with: every full block keeps a digest of all tokens from position 0 to
//            its end (chained block by block), and the prefix's digests must match. A caller
//            who can name a block but does not know its tokens learns nothing.
//   stable   a known sequence's table only grows: an earlier entry that changes is refused.
//   delta    a live sequence's chunk may send its table from table_start on (ExpandTables):
//            the rest is what this worker recorded, so it cannot name other blocks.
// Two pools (models with sliding-window layers, HandshakeRequest.num_sliding_kv_blocks): the
// worker keeps one KvOwnership per pool; the sliding one reads ChunkProto.sliding_table and
// sliding_table_start and knows the window W. There -1 means "no block": a chunk reads only the
// blocks of positions [start_pos - W + 1, end), which must be real; an entry may turn from a
// block into -1 (released: its writer is forgotten first, so a chunk of the same step may be
// handed the block), never back.
// A refusal is INVALID_ARGUMENT naming the sequence and block; Check changes nothing.
// Not thread-safe: the worker calls it under its step lock.
#pragma once

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "proto/moeshard.pb.h"

namespace moeshard {

class KvOwnership {
 public:
  enum class Table { kFull, kSliding };
  explicit KvOwnership(Table table = Table::kFull) : table_(table) {}

  // Live sequences a worker tracks at most (the coordinator runs far fewer at once).
  static constexpr int64_t kMaxLiveSequences = 1 << 16;

  // Forgets everything: a new pool of num_blocks blocks of block_size positions (the sliding
  // pool: read through a window of `window` positions).
  void Reset(int32_t block_size, int64_t num_blocks, int64_t window = 0);

  // Whether `req` may run: its released and preempted sequences count as gone, then every
  // chunk is checked against the blocks the live sequences wrote.
  absl::Status Check(const v1::StepRequest& req) const;
  // Records a checked step: forgets its released and preempted sequences, then records the
  // blocks and tokens each chunk writes.
  void Commit(const v1::StepRequest& req);
  // Rewrites each chunk sent as a delta (table_start > 0) with its whole table: the first
  // table_start entries of what this worker recorded for the live sequence, then the chunk's
  // entries. InvalidArgument (nothing usable) for a delta of a sequence that is not live here,
  // is released or preempted in this step, or starts past the recorded table. Check and Commit
  // then see whole tables.
  absl::Status ExpandTables(v1::StepRequest* req) const;
  // Whether any chunk of req is a delta (of either table).
  static bool HasDeltas(const v1::StepRequest& req);

  int64_t num_live() const { return static_cast<int64_t>(seqs_.size()); }

 private:
  static constexpr int64_t kNobody = INT64_MIN;
  struct Block {
    int64_t writer = kNobody;
    bool full = false;     // every position written: digest is valid
    uint64_t digest = 0;   // chained digest of the tokens from position 0 to the block's end
  };
  struct Seq {
    std::vector<int32_t> table;    // as far as the chunks seen read it
    std::vector<int32_t> tokens;   // positions 0.. (valid while chain_known)
    std::vector<uint64_t> chain;   // digest of each full block of tokens
    int64_t shared_blocks = 0;     // leading blocks read through the prefix cache
    bool chain_known = true;
  };

  absl::Status CheckChunk(const v1::ChunkProto& c, const std::unordered_set<int64_t>& gone,
                          const std::unordered_set<int32_t>& released) const;
  void CommitChunk(const v1::ChunkProto& c);
  // Blocks a known live sequence's chunk turns into -1 (it wrote them): free from this step on.
  std::unordered_set<int32_t> Released(const v1::StepRequest& req, const std::unordered_set<int64_t>& gone) const;
  const google::protobuf::RepeatedField<int32_t>& TableOf(const v1::ChunkProto& c) const {
    return table_ == Table::kFull ? c.block_table() : c.sliding_table();
  }
  int64_t TableStartOf(const v1::ChunkProto& c) const {
    return table_ == Table::kFull ? c.table_start() : c.sliding_table_start();
  }
  // The sliding table's record of a worker without a sliding pool (Reset with no blocks): it
  // checks only that no chunk sends a sliding table.
  bool no_pool() const { return table_ == Table::kSliding && blocks_.empty(); }
  // First table index a chunk starting at start_pos reads.
  int64_t FirstRead(int64_t start_pos) const {
    return window_ > 0 ? std::max<int64_t>(0, start_pos - window_ + 1) / block_size_ : 0;
  }
  // Digests of the full blocks of tokens[0, n).
  std::vector<uint64_t> Chain(const int32_t* tokens, int64_t n) const;
  void ExtendChain(Seq& s) const;

  Table table_;
  int32_t block_size_ = 1;
  int64_t window_ = 0;
  std::vector<Block> blocks_;
  std::unordered_map<int64_t, Seq> seqs_;
};

}  // namespace moeshard
