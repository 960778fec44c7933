#include "coordinator/block_pool.h"

#include "absl/strings/str_cat.h"

namespace moeshard {

BlockPool::BlockPool(int64_t num_blocks) : blocks_(std::max<int64_t>(0, num_blocks)) {
  for (int64_t i = 0; i < num_blocks; ++i) free_.push_back(static_cast<int32_t>(i));
}

int32_t BlockPool::Take(bool* evicted, uint64_t* evicted_key) {
  if (free_.empty()) {  // evict the least recently released cached block
    *evicted = true;
    *evicted_key = blocks_[lru_.front()].key;
    Uncache(lru_.front());
  }
  const int32_t id = free_.front();
  free_.pop_front();
  blocks_[id].ref_count = 1;
  ++num_used_;
  return id;
}

void BlockPool::Lock(int32_t id) {
  Block& b = blocks_[id];
  if (b.ref_count++ == 0) {
    lru_.erase(b.lru_pos);
    ++num_used_;
  }
}

void BlockPool::Release(int32_t id) {
  Block& b = blocks_[id];
  if (--b.ref_count > 0) return;
  --num_used_;
  if (b.cached) {
    b.lru_pos = lru_.insert(lru_.end(), id);
  } else {
    free_.push_back(id);
  }
}

void BlockPool::Cache(int32_t id, uint64_t key) {
  if (blocks_[id].cached) Uncache(id);
  Block& b = blocks_[id];
  b.cached = true;
  b.key = key;
  cache_[key] = id;
}

void BlockPool::Uncache(int32_t id) {
  Block& b = blocks_[id];
  if (!b.cached) return;
  auto it = cache_.find(b.key);
  if (it != cache_.end() && it->second == id) cache_.erase(it);
  b.cached = false;
  b.key = 0;
  if (b.ref_count == 0) {
    lru_.erase(b.lru_pos);
    free_.push_back(id);
  }
}

int32_t BlockPool::Find(uint64_t key) const {
  auto it = cache_.find(key);
  return it == cache_.end() ? -1 : it->second;
}

absl::Status BlockPool::CheckIntegrity(const std::vector<int64_t>& refs, const char* what) const {
  const int64_t n = num_blocks();
  auto bad = [&](auto&&... parts) { return absl::InternalError(absl::StrCat(what, " pool: ", parts...)); };
  std::vector<char> where(n, 0);  // 1 = free list, 2 = LRU
  for (int32_t id : free_) {
    if (id < 0 || id >= n || where[id]) return bad("free list holds block ", id, " twice or out of range");
    where[id] = 1;
  }
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    const int32_t id = *it;
    if (id < 0 || id >= n || where[id]) return bad("LRU holds block ", id, " twice, out of range or also free");
    if (blocks_[id].lru_pos != it) return bad("block ", id, " has a stale LRU position");
    where[id] = 2;
  }
  int64_t used = 0;
  for (int64_t id = 0; id < n; ++id) {
    const Block& b = blocks_[id];
    if (b.ref_count != refs[id]) return bad("block ", id, " ref_count ", b.ref_count, " but ", refs[id], " tables hold it");
    if (b.ref_count > 0) {
      ++used;
      if (where[id]) return bad("used block ", id, " is also free or evictable");
    } else if (where[id] != (b.cached ? 2 : 1)) {
      return bad("idle block ", id, (b.cached ? " is cached but not evictable" : " is neither cached nor free"));
    }
    if (b.cached && Find(b.key) != id) return bad("cached block ", id, " missing from the key map");
  }
  if (used != num_used_) return bad("used count ", num_used_, " but ", used, " blocks are referenced");
  for (const auto& [key, id] : cache_) {
    if (id < 0 || id >= n || !blocks_[id].cached || blocks_[id].key != key) return bad("key map entry for block ", id, " is stale");
  }
  return absl::OkStatus();
}

}  // namespace moeshard
