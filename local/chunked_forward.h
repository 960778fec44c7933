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
#include <vector>

#include "absl/status/status.h"
#include "worker/model_runner.h"

namespace moeshard {

// The steps `batch` is cut into (exposed for tests). Requires max_step_tokens >= 1.
std::vector<std::vector<SeqChunk>> SplitIntoSteps(const std::vector<SeqChunk>& batch, int64_t max_step_tokens);

// Runs `batch` through `runner` in steps of at most max_step_tokens (<= 0: the runner's
// options().max_batch_tokens). logits: [rows, V] as one Forward of the whole batch gives.
// Errors: the first failing step's (Forward's own validation included).
absl::Status ForwardChunked(ModelRunner& runner, const std::vector<SeqChunk>& batch, std::vector<float>* logits,
                            int64_t max_step_tokens = 0);

}  // namespace moeshard
