#include "worker/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace moeshard {

KvCache::KvCache(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads, int64_t head_dim,
                 const std::vector<bool>& in_sliding_pool, int64_t num_sliding_blocks)
    : num_blocks_(num_blocks), block_size_(block_size), slot_(kv_heads * head_dim), k_(num_layers), v_(num_layers) {
  for (int64_t l = 0; l < num_layers; ++l) {
    const bool sliding = l < static_cast<int64_t>(in_sliding_pool.size()) && in_sliding_pool[l];
    const int64_t blocks = sliding ? num_sliding_blocks : num_blocks;
    k_[l].assign(blocks * block_size * slot_, 0.f);
    v_[l].assign(blocks * block_size * slot_, 0.f);
  }
}

size_t KvCache::bytes() const {
  size_t floats = 0;
  for (size_t l = 0; l < k_.size(); ++l) floats += k_[l].size() + v_[l].size();
  return floats * sizeof(float);
}

absl::Status KvCache::Write(int64_t layer, const std::vector<int32_t>& table, int64_t pos0, int64_t T,
                            const float* k, const float* v) {
  for (int64_t t = 0; t < T; ++t) {
    int64_t p = pos0 + t;
    int64_t off = (static_cast<int64_t>(table[p / block_size_]) * block_size_ + p % block_size_) * slot_;
    std::memcpy(k_[layer].data() + off, k + t * slot_, slot_ * sizeof(float));
    std::memcpy(v_[layer].data() + off, v + t * slot_, slot_ * sizeof(float));
  }
  return absl::OkStatus();
}

BlockAllocator::BlockAllocator(int64_t num_blocks) {
  for (int64_t i = num_blocks - 1; i >= 0; --i) free_.push_back(static_cast<int32_t>(i));
}

absl::Status BlockAllocator::Reserve(std::vector<int32_t>& table, int64_t n, int64_t block_size) {
  int64_t need = (n + block_size - 1) / block_size;
  while (static_cast<int64_t>(table.size()) < need) {
    if (free_.empty()) return absl::ResourceExhaustedError("KV cache: out of blocks");
    table.push_back(free_.back());
    free_.pop_back();
  }
  return absl::OkStatus();
}

void BlockAllocator::ReleaseBeforeWindow(std::vector<int32_t>& table, int64_t start_pos, int64_t window,
                                         int64_t block_size) {
  const int64_t first = std::max<int64_t>(0, start_pos - window + 1) / block_size;
  for (int64_t i = 0; i < std::min<int64_t>(first, static_cast<int64_t>(table.size())); ++i) {
    if (table[i] >= 0) free_.push_back(table[i]);
    table[i] = -1;
  }
}

void BlockAllocator::Free(std::vector<int32_t>& table) {
  for (int32_t b : table) {
    if (b >= 0) free_.push_back(b);
  }
  table.clear();
}

}  // namespace moeshard
