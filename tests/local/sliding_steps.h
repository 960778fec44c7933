// A sequence run through a runner step by step, its sliding-window layers' KV in their own pool
// (or not), for the tests that compare the two (tests/local/sliding_pool_test.cc on the CPU,
// tests/worker/gpu_sliding_pool_test.cc on a GPU): prefill chunks, then one token a step; before
// each step the sliding table releases the blocks wholly before the window of the step's first
// position (BlockAllocator::ReleaseBeforeWindow, BlockManager's rule) and grows, so its few
// blocks are recycled over and over.
#pragma once

#include <algorithm>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/kv_cache.h"
#include "worker/model_runner.h"

namespace moeshard::test {

struct SlidingSteps {
  int64_t prefill_chunk = 24;  // tokens per step before prefill_end
  int64_t prefill_end = 96;    // then one token a step
};

// Every position's logits of `tokens` (all_logits), [tokens.size(), V]. The sliding table is
// kept when the runner has a sliding pool (RunnerOptions::num_sliding_kv_blocks > 0).
inline absl::StatusOr<std::vector<float>> RunSlidingSteps(ModelRunner& runner, const std::vector<int32_t>& tokens,
                                                          const SlidingSteps& steps = {}) {
  const RunnerOptions& o = runner.options();
  const int64_t bs = o.block_size, window = runner.config().sliding_window;
  BlockAllocator full(o.num_kv_blocks), sliding(o.num_sliding_kv_blocks);
  std::vector<int32_t> table, sliding_table;
  std::vector<float> all, logits;
  const int64_t len = static_cast<int64_t>(tokens.size());
  for (int64_t pos = 0; pos < len;) {
    const int64_t n = std::min(len - pos, pos < steps.prefill_end ? steps.prefill_chunk : 1);
    absl::Status st = full.Reserve(table, pos + n, bs);
    if (st.ok() && runner.sliding_pool()) {
      sliding.ReleaseBeforeWindow(sliding_table, pos, window, bs);
      st = sliding.Reserve(sliding_table, pos + n, bs);
    }
    if (st.ok()) {
      SeqChunk c{std::vector<int32_t>(tokens.begin() + pos, tokens.begin() + pos + n), pos, table, true, sliding_table};
      st = runner.Forward({c}, &logits);
    }
    if (!st.ok()) return st;
    all.insert(all.end(), logits.begin(), logits.end());
    pos += n;
  }
  return all;
}

}  // namespace moeshard::test
