#include "common/model/kv_pools.h"

#include <algorithm>

namespace moeshard {

bool HasBothLayerKinds(const ModelConfig& config) {
  if (config.sliding_window <= 0) return false;
  const auto sliding = std::count_if(config.layers.begin(), config.layers.end(), [](const LayerSpec& l) { return l.sliding; });
  return sliding > 0 && sliding < static_cast<int64_t>(config.layers.size());
}

int64_t DefaultSlidingKvBlocks(const ModelConfig& config, int64_t num_kv_blocks, int64_t block_size,
                               int64_t max_num_seqs, int64_t max_tokens_per_step) {
  if (!HasBothLayerKinds(config) || block_size < 1) return 0;
  auto blocks = [&](int64_t n) { return (n + block_size - 1) / block_size; };
  const int64_t n = std::max<int64_t>(max_num_seqs, 1) * (blocks(config.sliding_window - 1) + 2) +
                    2 * blocks(std::max<int64_t>(max_tokens_per_step, 1));
  return n < num_kv_blocks ? n : 0;
}

}  // namespace moeshard
