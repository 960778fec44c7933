// Chunked prefill for the in-process callers that run a runner directly (`moeshard check`'s
// all-position logits, `moeshard eval`'s windows): a batch of any length goes through the
// runner in steps of at most max_step_tokens tokens (the GPU runner refuses a bigger step;
// its scratch memory is sized for max_batch_tokens), with the same logits as one big step.
// The serving path chunks in the coordinator's scheduler instead (Engine, max_tokens_per_step).
//
// How a batch is cut: the chunks' tokens, laid end to end in batch order, are cut into steps
// of max_step_tokens; a chunk that straddles a cut continues at the start of the next step
// at its next position, reading the KV cache the earlier step wrote (each chunk's
// block_table already covers all its positions). A chunk appears at most once per step, so no
// step reads KV that the same step writes. Rows come back in the order of one big step: every
// position of an all_logits chunk, the last position of any other (the rows of a cut chunk's
// earlier pieces are dropped). On the CPU (float32) the result is bit-identical to one step:
// every row's arithmetic is the same whatever the step size (tests/local/chunked_forward_test).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "worker/kv_cache.h"
#include "worker/model_runner.h"

namespace moeshard {

// A runner with a sliding pool (ModelRunner::sliding_pool(): a model with both layer kinds and
// RunnerOptions::num_sliding_kv_blocks > 0) reads and writes its sliding-window layers' KV through
// each chunk's sliding_table. SlidingTables keeps those tables for the in-process callers, one per
// sequence (any key, the same one for all of a sequence's steps), by the coordinator's rule:
// before a step at start_pos the blocks wholly before start_pos - window + 1 go back to the pool
// (entries -1), and blocks up to the step's last position are reserved. Without a sliding pool
// it does nothing, and the chunks keep an empty sliding_table.
class SlidingTables {
 public:
  explicit SlidingTables(const ModelRunner& runner);
  bool enabled() const { return enabled_; }
  // Sets piece.sliding_table for a step of sequence `seq` covering
  // [piece.start_pos, piece.start_pos + piece.tokens.size()). ResourceExhausted when the pool
  // runs out (num_sliding_kv_blocks too small for the sequences held at once).
  absl::Status Prepare(int64_t seq, SeqChunk& piece);
  void Release(int64_t seq);  // the sequence's blocks back to the pool
  int64_t num_free() const { return alloc_.num_free(); }

 private:
  bool enabled_;
  int64_t window_, block_size_;
  BlockAllocator alloc_;
  std::map<int64_t, std::vector<int32_t>> tables_;
};

// The steps `batch` is cut into (exposed for tests). Requires max_step_tokens >= 1.
std::vector<std::vector<SeqChunk>> SplitIntoSteps(const std::vector<SeqChunk>& batch, int64_t max_step_tokens);

// Runs `batch` through `runner` in steps of at most max_step_tokens (<= 0: the runner's
// options().max_batch_tokens). logits: [rows, V] as one Forward of the whole batch gives.
// With a sliding pool each chunk's sliding table comes from `sliding` (chunk i is sequence i),
// or, when null, from tables of this call alone (released when it returns: for a caller that
// does not continue the sequences afterwards). Errors: the first failing step's (Forward's own
// validation included).
absl::Status ForwardChunked(ModelRunner& runner, const std::vector<SeqChunk>& batch, std::vector<float>* logits,
                            int64_t max_step_tokens = 0, SlidingTables* sliding = nullptr);

}  // namespace moeshard
