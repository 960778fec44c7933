#include "worker/kv_cache.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace moeshard {

KvCache::KvCache(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads, int64_t head_dim)
    : num_blocks_(num_blocks), block_size_(block_size), slot_(kv_heads * head_dim), k_(num_layers), v_(num_layers) {
  for (int64_t l = 0; l < num_layers; ++l) {
    k_[l].assign(num_blocks * block_size * slot_, 0.f);
    v_[l].assign(num_blocks * block_size * slot_, 0.f);
  }
}

size_t KvCache::bytes() const { return 2 * k_.size() * num_blocks_ * block_size_ * slot_ * sizeof(float); }

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

void BlockAllocator::Free(std::vector<int32_t>& table) {
  for (int32_t b : table) free_.push_back(b);
  table.clear();
}

}  // namespace moeshard
