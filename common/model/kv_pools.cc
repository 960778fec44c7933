#include "common/model/kv_pools.h"

#include <algorithm>

namespace moeshard {
namespace {

int64_t CeilDiv(int64_t n, int64_t d) { return (n + d - 1) / d; }

}  // namespace

bool HasBothLayerKinds(const ModelConfig& config) {
  if (config.sliding_window <= 0) return false;
  const auto sliding = std::count_if(config.layers.begin(), config.layers.end(), [](const LayerSpec& l) { return l.sliding; });
  return sliding > 0 && sliding < static_cast<int64_t>(config.layers.size());
}

int64_t DefaultSlidingKvBlocks(const ModelConfig& config, int64_t num_kv_blocks, int64_t block_size,
                               int64_t max_num_seqs, int64_t max_tokens_per_step) {
  if (!HasBothLayerKinds(config) || block_size < 1) return 0;
  const int64_t n = std::max<int64_t>(max_num_seqs, 1) * (CeilDiv(config.sliding_window - 1, block_size) + 2) +
                    2 * CeilDiv(std::max<int64_t>(max_tokens_per_step, 1), block_size);
  return n < num_kv_blocks ? n : 0;
}

KvBytesByKind SequenceKvBytes(const ModelConfig& config, double bytes_per_token_layer, int64_t context,
                              int64_t block_size) {
  KvBytesByKind k;
  const bool two = HasBothLayerKinds(config) && block_size > 0;
  const int64_t layers = static_cast<int64_t>(config.layers.size());
  k.sliding_layers =
      two ? std::count_if(config.layers.begin(), config.layers.end(), [](const LayerSpec& l) { return l.sliding; }) : 0;
  k.full_layers = layers - k.sliding_layers;
  const int64_t ctx = std::max<int64_t>(context, 0);
  k.full_bytes = static_cast<double>(k.full_layers) * static_cast<double>(ctx) * bytes_per_token_layer;
  if (two) {
    const int64_t held =
        std::min(CeilDiv(ctx, block_size), CeilDiv(config.sliding_window - 1, block_size) + 1) * block_size;
    k.sliding_bytes = static_cast<double>(k.sliding_layers) * static_cast<double>(held) * bytes_per_token_layer;
  }
  return k;
}

}  // namespace moeshard
