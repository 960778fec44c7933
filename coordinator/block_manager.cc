#include "coordinator/block_manager.h"

#include <algorithm>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/splitmix64.h"

namespace moeshard {
namespace {

uint64_t DefaultHash(uint64_t parent_hash, const int32_t* tokens, int64_t num_tokens) {
  uint64_t h = SplitMix64Mix(parent_hash ^ kSplitMix64Gamma);
  for (int64_t i = 0; i < num_tokens; ++i) h = SplitMix64Mix(h + static_cast<uint32_t>(tokens[i]));
  return h;
}

}  // namespace

BlockManager::BlockManager(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching)
    : block_size_(std::max<int64_t>(1, block_size)),
      enable_prefix_caching_(enable_prefix_caching),
      hash_fn_(&DefaultHash),
      blocks_(std::max<int64_t>(0, num_blocks)) {
  for (int64_t i = 0; i < num_blocks; ++i) free_.push_back(static_cast<int32_t>(i));
}

std::vector<int32_t> BlockManager::Match(const std::vector<int32_t>& tokens, uint64_t* hash,
                                         uint64_t* entry) const {
  std::vector<int32_t> ids;
  uint64_t h = 0, e = 0;
  if (enable_prefix_caching_ && !tokens.empty()) {
    const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / block_size_;
    for (int64_t i = 0; i < max_blocks; ++i) {
      const int32_t* t = tokens.data() + i * block_size_;
      const uint64_t nh = hash_fn_(h, t, block_size_);
      auto it = cache_.find(nh);
      if (it == cache_.end()) break;
      const Block& b = blocks_[it->second];
      if (b.parent_entry != e || !std::equal(b.tokens.begin(), b.tokens.end(), t)) break;
      ids.push_back(it->second);
      h = nh;
      e = b.entry;
    }
  }
  *hash = h;
  *entry = e;
  return ids;
}

bool BlockManager::CanAllocate(const std::vector<int32_t>& tokens) const {
  if (tokens.empty()) return false;
  uint64_t h, e;
  std::vector<int32_t> ids = Match(tokens, &h, &e);
  const int64_t idle_matched = std::count_if(ids.begin(), ids.end(), [&](int32_t id) { return blocks_[id].ref_count == 0; });
  const int64_t need = BlocksFor(static_cast<int64_t>(tokens.size())) - static_cast<int64_t>(ids.size());
  return need <= num_free_blocks() - idle_matched;
}

absl::StatusOr<int64_t> BlockManager::Allocate(int64_t seq_id, const std::vector<int32_t>& tokens) {
  if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("sequence ", seq_id, " has no tokens"));
  if (seqs_.count(seq_id)) return absl::AlreadyExistsError(absl::StrCat("sequence ", seq_id, " already has blocks"));
  if (!CanAllocate(tokens)) {
    return absl::ResourceExhaustedError(absl::StrCat("sequence ", seq_id, ": ", tokens.size(), " tokens need ",
                                                     BlocksFor(tokens.size()), " blocks, ", num_free_blocks(),
                                                     " free"));
  }
  SeqBlocks sb;
  std::vector<int32_t> ids = Match(tokens, &sb.last_hash, &sb.last_entry);
  for (int32_t id : ids) {  // lock the matched prefix before taking new blocks (so it is not evicted)
    Block& b = blocks_[id];
    if (b.ref_count++ == 0) {
      lru_.erase(b.lru_pos);
      ++num_used_;
    }
    sb.table.push_back(id);
  }
  sb.num_hashed = static_cast<int64_t>(ids.size());
  while (static_cast<int64_t>(sb.table.size()) < BlocksFor(tokens.size())) sb.table.push_back(TakeBlock());
  const int64_t cached = sb.num_hashed * block_size_;
  seqs_.emplace(seq_id, std::move(sb));
  prefix_query_tokens_ += static_cast<int64_t>(tokens.size());
  prefix_hit_tokens_ += cached;
  return cached;
}

bool BlockManager::CanAppend(int64_t seq_id, int64_t new_total_tokens) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return false;
  return BlocksFor(new_total_tokens) - static_cast<int64_t>(it->second.table.size()) <= num_free_blocks();
}

absl::Status BlockManager::Append(int64_t seq_id, int64_t new_total_tokens) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("sequence ", seq_id, " has no blocks"));
  std::vector<int32_t>& table = it->second.table;
  const int64_t need = BlocksFor(new_total_tokens) - static_cast<int64_t>(table.size());
  if (need <= 0) return absl::OkStatus();
  if (need > num_free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("sequence ", seq_id, " needs ", need, " more blocks, ",
                                                     num_free_blocks(), " free"));
  }
  for (int64_t i = 0; i < need; ++i) table.push_back(TakeBlock());
  return absl::OkStatus();
}

void BlockManager::MarkComputed(int64_t seq_id, const std::vector<int32_t>& tokens, int64_t num_computed) {
  if (!enable_prefix_caching_) return;
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  SeqBlocks& sb = it->second;
  const int64_t n = std::min({num_computed, static_cast<int64_t>(tokens.size()),
                              static_cast<int64_t>(sb.table.size()) * block_size_});
  for (int64_t i = sb.num_hashed; i < n / block_size_; ++i) {
    const int32_t* t = tokens.data() + i * block_size_;
    const uint64_t h = hash_fn_(sb.last_hash, t, block_size_);
    auto hit = cache_.find(h);
    if (hit != cache_.end()) {
      const Block& other = blocks_[hit->second];
      if (other.parent_entry == sb.last_entry && std::equal(other.tokens.begin(), other.tokens.end(), t)) {
        sb.last_hash = h;  // the same content is cached already: keep it, chain to it
        sb.last_entry = other.entry;
        sb.num_hashed = i + 1;
        continue;
      }
      Uncache(hit->second);  // collision or stale chain: the newer registration wins
    }
    const int32_t id = sb.table[i];
    if (blocks_[id].cached) Uncache(id);
    Block& b = blocks_[id];
    b.cached = true;
    b.hash = h;
    b.entry = next_entry_++;
    b.parent_entry = sb.last_entry;
    b.tokens.assign(t, t + block_size_);
    cache_[h] = id;
    sb.last_hash = h;
    sb.last_entry = b.entry;
    sb.num_hashed = i + 1;
  }
}

void BlockManager::Free(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  const std::vector<int32_t>& table = it->second.table;
  for (auto r = table.rbegin(); r != table.rend(); ++r) Release(*r);
  seqs_.erase(it);
}

const std::vector<int32_t>& BlockManager::BlockTable(int64_t seq_id) const {
  static const std::vector<int32_t> kEmpty;
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? kEmpty : it->second.table;
}

double BlockManager::Usage() const {
  return blocks_.empty() ? 0.0 : static_cast<double>(num_used_) / static_cast<double>(blocks_.size());
}

int32_t BlockManager::TakeBlock() {
  if (free_.empty()) Uncache(lru_.front());  // evict the least recently released cached block
  const int32_t id = free_.front();
  free_.pop_front();
  blocks_[id].ref_count = 1;
  ++num_used_;
  return id;
}

void BlockManager::Uncache(int32_t block_id) {
  Block& b = blocks_[block_id];
  if (!b.cached) return;
  auto it = cache_.find(b.hash);
  if (it != cache_.end() && it->second == block_id) cache_.erase(it);
  b.cached = false;
  b.hash = b.entry = b.parent_entry = 0;
  b.tokens.clear();
  if (b.ref_count == 0) {
    lru_.erase(b.lru_pos);
    free_.push_back(block_id);
  }
}

void BlockManager::Release(int32_t block_id) {
  Block& b = blocks_[block_id];
  if (--b.ref_count > 0) return;
  --num_used_;
  if (b.cached) {
    b.lru_pos = lru_.insert(lru_.end(), block_id);
  } else {
    free_.push_back(block_id);
  }
}

absl::Status BlockManager::CheckIntegrity() const {
  const int64_t n = num_blocks();
  auto bad = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  std::vector<int64_t> refs(n, 0);
  for (const auto& [seq_id, sb] : seqs_) {
    std::unordered_set<int32_t> seen;
    for (int32_t id : sb.table) {
      if (id < 0 || id >= n) return bad("sequence ", seq_id, " holds block ", id, " out of range");
      if (!seen.insert(id).second) return bad("sequence ", seq_id, " holds block ", id, " twice");
      ++refs[id];
    }
    if (sb.num_hashed > static_cast<int64_t>(sb.table.size())) return bad("sequence ", seq_id, " hashed past its table");
  }
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
    if (b.cached) {
      auto it = cache_.find(b.hash);
      if (it == cache_.end() || it->second != id) return bad("cached block ", id, " missing from the hash map");
      if (static_cast<int64_t>(b.tokens.size()) != block_size_ || b.entry == 0) return bad("cached block ", id, " malformed");
    }
  }
  if (used != num_used_) return bad("used count ", num_used_, " but ", used, " blocks are referenced");
  for (const auto& [h, id] : cache_) {
    if (id < 0 || id >= n || !blocks_[id].cached || blocks_[id].hash != h) return bad("hash map entry for block ", id, " is stale");
  }
  if (!enable_prefix_caching_ && !cache_.empty()) return bad("prefix caching is off but blocks are cached");
  return absl::OkStatus();
}

}  // namespace moeshard
