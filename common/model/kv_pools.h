// How many KV blocks the sliding-window layers' own pool gets (docs/design/long-context.md,
// "The model's KV by layer kind"). A model with both full-attention and sliding-window layers
// keeps the sliding layers' KV in a second pool whose per-sequence table holds only the blocks
// the window can still see: ceil(W / block_size) + 1 between steps, plus one chunk's during a
// step. Pure functions.
#pragma once

#include <cstdint>

#include "common/model/model_config.h"

namespace moeshard {

// Whether the model has both full-attention and sliding-window layers (two KV pools).
bool HasBothLayerKinds(const ModelConfig& config);

// The default size of the sliding pool for a coordinator of these limits: every running
// sequence's window plus a block of slack (max_num_seqs * (ceil((W - 1) / bs) + 2)) and two
// steps' chunks (2 * ceil(max_tokens_per_step / bs)), so that no admitted sequence waits on the
// sliding pool alone. 0 (one pool, as for a one-kind model) when the model has one kind, or
// when that is not smaller than num_kv_blocks (a small pool gains nothing from a second one).
int64_t DefaultSlidingKvBlocks(const ModelConfig& config, int64_t num_kv_blocks, int64_t block_size,
                               int64_t max_num_seqs, int64_t max_tokens_per_step);

// One sequence's KV memory by layer kind at `context` tokens, between steps: full-attention
// layers hold every position; with both kinds (two pools) each sliding-window layer holds only the
// blocks its window can still see (ceil((W - 1) / block_size) + 1, at most the context's) — flat
// as the context grows past the window. A one-kind model keeps every position in every layer.
struct KvBytesByKind {
  int64_t full_layers = 0, sliding_layers = 0;
  double full_bytes = 0, sliding_bytes = 0;
};
KvBytesByKind SequenceKvBytes(const ModelConfig& config, double bytes_per_token_layer, int64_t context,
                              int64_t block_size);

}  // namespace moeshard
