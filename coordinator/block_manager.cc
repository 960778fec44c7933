#include "coordinator/block_manager.h"

#include <algorithm>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/splitmix64.h"
#include "common/status.h"

namespace moeshard {
namespace {

uint64_t DefaultHash(uint64_t parent_hash, const int32_t* tokens, int64_t num_tokens) {
  uint64_t h = SplitMix64Mix(parent_hash ^ kSplitMix64Gamma);
  for (int64_t i = 0; i < num_tokens; ++i) h = SplitMix64Mix(h + static_cast<uint32_t>(tokens[i]));
  return h;
}

int64_t CountIdle(const BlockPool& pool, const std::vector<int32_t>& ids) {
  return std::count_if(ids.begin(), ids.end(), [&](int32_t id) { return pool.block(id).ref_count == 0; });
}

}  // namespace

BlockManager::BlockManager(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching,
                           int64_t num_sliding_blocks, int64_t sliding_window)
    : block_size_(std::max<int64_t>(1, block_size)),
      enable_prefix_caching_(enable_prefix_caching),
      window_(num_sliding_blocks > 0 && sliding_window > 0 ? sliding_window : 0),
      hash_fn_(&DefaultHash),
      full_(num_blocks),
      sliding_(window_ > 0 ? num_sliding_blocks : 0),
      meta_(std::max<int64_t>(0, num_blocks)) {}

int64_t BlockManager::FirstSlidingBlock(int64_t start_pos) const {
  return window_ > 0 ? std::max<int64_t>(0, start_pos - window_ + 1) / block_size_ : 0;
}

BlockManager::MatchResult BlockManager::Match(const std::vector<int32_t>& tokens) const {
  MatchResult r;
  if (!enable_prefix_caching_ || tokens.empty()) return r;
  std::vector<uint64_t> hashes, entries;
  uint64_t h = 0, e = 0;
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / block_size_;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const int32_t* t = tokens.data() + i * block_size_;
    const uint64_t nh = hash_fn_(h, t, block_size_);
    const int32_t id = full_.Find(nh);
    if (id < 0) break;
    const FullMeta& m = meta_[id];
    if (m.parent_entry != e || !std::equal(m.tokens.begin(), m.tokens.end(), t)) break;
    r.full.push_back(id);
    hashes.push_back(h = nh);
    entries.push_back(e = m.entry);
  }
  int64_t m = static_cast<int64_t>(r.full.size());
  if (has_sliding_pool() && m > 0) {
    // run[j]: how many consecutive blocks up to j have their sliding block cached.
    std::vector<int64_t> run(m);
    for (int64_t j = 0; j < m; ++j) run[j] = sliding_.Find(entries[j]) < 0 ? 0 : (j > 0 ? run[j - 1] : 0) + 1;
    while (m > 0 && run[m - 1] < m - FirstSlidingBlock(m * block_size_)) --m;  // clip to a usable hit
    r.full.resize(m);
    for (int64_t j = FirstSlidingBlock(m * block_size_); j < m; ++j) r.sliding.push_back(sliding_.Find(entries[j]));
  }
  r.hash = m > 0 ? hashes[m - 1] : 0;
  r.entry = m > 0 ? entries[m - 1] : 0;
  return r;
}

int64_t BlockManager::NewSlidingBlocks(int64_t n, int64_t cached, int64_t num_hit_sliding,
                                       int64_t first_chunk_tokens) const {
  if (!has_sliding_pool()) return 0;
  const int64_t end = cached + std::clamp<int64_t>(first_chunk_tokens, 1, n - cached);
  return BlocksFor(end) - FirstSlidingBlock(cached) - num_hit_sliding;
}

bool BlockManager::CanAllocate(const std::vector<int32_t>& tokens, int64_t first_chunk_tokens) const {
  if (tokens.empty()) return false;
  const MatchResult r = Match(tokens);
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t need = BlocksFor(n) - static_cast<int64_t>(r.full.size());
  if (need > full_.num_available() - CountIdle(full_, r.full)) return false;
  const int64_t cached = static_cast<int64_t>(r.full.size()) * block_size_;
  const int64_t need_sliding = NewSlidingBlocks(n, cached, static_cast<int64_t>(r.sliding.size()), first_chunk_tokens);
  return need_sliding <= sliding_.num_available() - CountIdle(sliding_, r.sliding);
}

absl::StatusOr<int64_t> BlockManager::Allocate(int64_t seq_id, const std::vector<int32_t>& tokens,
                                               int64_t first_chunk_tokens) {
  if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("sequence ", seq_id, " has no tokens"));
  if (seqs_.count(seq_id)) return absl::AlreadyExistsError(absl::StrCat("sequence ", seq_id, " already has blocks"));
  if (!CanAllocate(tokens, first_chunk_tokens)) {
    return absl::ResourceExhaustedError(absl::StrCat("sequence ", seq_id, ": ", tokens.size(), " tokens need ",
                                                     BlocksFor(tokens.size()), " blocks, ", num_free_blocks(),
                                                     " free (", sliding_.num_available(), " sliding)"));
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  MatchResult r = Match(tokens);
  SeqBlocks sb;
  // Lock the matched prefix before taking new blocks (so it is not evicted).
  for (int32_t id : r.full) full_.Lock(id);
  for (int32_t id : r.sliding) sliding_.Lock(id);
  sb.table = std::move(r.full);
  sb.num_hashed = static_cast<int64_t>(sb.table.size());
  sb.last_hash = r.hash;
  sb.last_entry = r.entry;
  const int64_t cached = sb.num_hashed * block_size_;
  while (static_cast<int64_t>(sb.table.size()) < BlocksFor(n)) sb.table.push_back(TakeFull());
  if (has_sliding_pool()) {
    const int64_t fresh = NewSlidingBlocks(n, cached, static_cast<int64_t>(r.sliding.size()), first_chunk_tokens);
    sb.sliding.assign(FirstSlidingBlock(cached), -1);
    sb.sliding.insert(sb.sliding.end(), r.sliding.begin(), r.sliding.end());
    for (int64_t i = 0; i < fresh; ++i) sb.sliding.push_back(TakeSliding());
  }
  seqs_.emplace(seq_id, std::move(sb));
  prefix_query_tokens_ += n;
  prefix_hit_tokens_ += cached;
  return cached;
}

int64_t BlockManager::SlidingFreedBy(const SeqBlocks& sb, int64_t first) const {
  int64_t freed = 0;
  for (int64_t i = 0; i < std::min<int64_t>(first, static_cast<int64_t>(sb.sliding.size())); ++i) {
    freed += sb.sliding[i] >= 0 && sliding_.block(sb.sliding[i]).ref_count == 1;
  }
  return freed;
}

bool BlockManager::CanAppend(int64_t seq_id, int64_t start_pos, int64_t new_total_tokens) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return false;
  const SeqBlocks& sb = it->second;
  if (BlocksFor(new_total_tokens) - static_cast<int64_t>(sb.table.size()) > num_free_blocks()) return false;
  if (!has_sliding_pool()) return true;
  const int64_t first = FirstSlidingBlock(start_pos);
  const int64_t need = BlocksFor(new_total_tokens) - std::max(first, static_cast<int64_t>(sb.sliding.size()));
  return need <= sliding_.num_available() + SlidingFreedBy(sb, first);
}

absl::Status BlockManager::Append(int64_t seq_id, int64_t start_pos, int64_t new_total_tokens) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("sequence ", seq_id, " has no blocks"));
  if (!CanAppend(seq_id, start_pos, new_total_tokens)) {
    return absl::ResourceExhaustedError(absl::StrCat("sequence ", seq_id, " needs more blocks for ", new_total_tokens,
                                                     " tokens; ", num_free_blocks(), " free, ",
                                                     sliding_.num_available(), " sliding free"));
  }
  SeqBlocks& sb = it->second;
  while (static_cast<int64_t>(sb.table.size()) < BlocksFor(new_total_tokens)) sb.table.push_back(TakeFull());
  if (has_sliding_pool()) {
    std::vector<int32_t>& s = sb.sliding;
    const int64_t first = FirstSlidingBlock(start_pos);
    for (int64_t i = std::min<int64_t>(first, static_cast<int64_t>(s.size())) - 1; i >= 0; --i) {
      if (s[i] < 0) break;  // entries before a released one are released
      sliding_.Release(s[i]);
      s[i] = -1;
    }
    while (static_cast<int64_t>(s.size()) < first) s.push_back(-1);
    while (static_cast<int64_t>(s.size()) < BlocksFor(new_total_tokens)) s.push_back(TakeSliding());
  }
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
    const int32_t hit = full_.Find(h);
    bool keep_other = false;
    if (hit >= 0) {
      const FullMeta& other = meta_[hit];
      keep_other = other.parent_entry == sb.last_entry && std::equal(other.tokens.begin(), other.tokens.end(), t);
      if (!keep_other) UncacheFull(hit);  // collision or stale chain: the newer registration wins
    }
    if (keep_other) {
      sb.last_entry = meta_[hit].entry;  // the same content is cached already: keep it, chain to it
    } else {
      const int32_t id = sb.table[i];
      UncacheFull(id);
      FullMeta& m = meta_[id];
      m.entry = next_entry_++;
      m.parent_entry = sb.last_entry;
      m.tokens.assign(t, t + block_size_);
      full_.Cache(id, h);
      sb.last_entry = m.entry;
    }
    sb.last_hash = h;
    sb.num_hashed = i + 1;
    if (i < static_cast<int64_t>(sb.sliding.size()) && sb.sliding[i] >= 0 && sliding_.Find(sb.last_entry) < 0 &&
        !sliding_.block(sb.sliding[i]).cached) {
      sliding_.Cache(sb.sliding[i], sb.last_entry);  // under the chain's entry for block i
    }
  }
}

void BlockManager::Free(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  const SeqBlocks& sb = it->second;
  for (auto r = sb.table.rbegin(); r != sb.table.rend(); ++r) full_.Release(*r);
  for (auto r = sb.sliding.rbegin(); r != sb.sliding.rend(); ++r) {
    if (*r >= 0) sliding_.Release(*r);
  }
  seqs_.erase(it);
}

const std::vector<int32_t>& BlockManager::BlockTable(int64_t seq_id) const {
  static const std::vector<int32_t> kEmpty;
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? kEmpty : it->second.table;
}

const std::vector<int32_t>& BlockManager::SlidingTable(int64_t seq_id) const {
  static const std::vector<int32_t> kEmpty;
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? kEmpty : it->second.sliding;
}

double BlockManager::Usage() const {
  return num_blocks() == 0 ? 0.0 : static_cast<double>(full_.num_used()) / static_cast<double>(num_blocks());
}

KvPoolStats BlockManager::Stats(KvKind kind) const {
  const BlockPool& p = kind == KvKind::kFull ? full_ : sliding_;
  return {p.num_blocks(), p.num_used(), p.num_evictable(), p.num_available() - p.num_evictable()};
}

int32_t BlockManager::TakeFull() {
  bool evicted = false;
  uint64_t key = 0;
  const int32_t id = full_.Take(&evicted, &key);
  if (evicted) {  // the pool dropped the hash; drop what hangs on the entry
    const int32_t s = has_sliding_pool() ? sliding_.Find(meta_[id].entry) : -1;
    if (s >= 0) sliding_.Uncache(s);
    meta_[id] = FullMeta{};
  }
  return id;
}

int32_t BlockManager::TakeSliding() {
  bool evicted = false;
  uint64_t key = 0;
  return sliding_.Take(&evicted, &key);
}

void BlockManager::UncacheFull(int32_t id) {
  if (!full_.block(id).cached) return;
  const int32_t s = has_sliding_pool() ? sliding_.Find(meta_[id].entry) : -1;
  if (s >= 0) sliding_.Uncache(s);
  full_.Uncache(id);
  meta_[id] = FullMeta{};
}

absl::Status BlockManager::CheckIntegrity() const {
  auto bad = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  std::vector<int64_t> refs(num_blocks(), 0), sliding_refs(sliding_.num_blocks(), 0);
  for (const auto& [seq_id, sb] : seqs_) {
    std::unordered_set<int32_t> seen;
    for (int32_t id : sb.table) {
      if (id < 0 || id >= num_blocks()) return bad("sequence ", seq_id, " holds block ", id, " out of range");
      if (!seen.insert(id).second) return bad("sequence ", seq_id, " holds block ", id, " twice");
      ++refs[id];
    }
    if (sb.num_hashed > static_cast<int64_t>(sb.table.size())) return bad("sequence ", seq_id, " hashed past its table");
    if (!has_sliding_pool() && !sb.sliding.empty()) return bad("sequence ", seq_id, " has a sliding table without a pool");
    if (sb.sliding.size() > sb.table.size()) return bad("sequence ", seq_id, "'s sliding table outgrew its table");
    seen.clear();
    bool held = false;
    for (int32_t id : sb.sliding) {
      if (id < 0 && held) return bad("sequence ", seq_id, " released a sliding block inside its window");
      if (id < 0) continue;
      held = true;
      if (id >= sliding_.num_blocks()) return bad("sequence ", seq_id, " holds sliding block ", id, " out of range");
      if (!seen.insert(id).second) return bad("sequence ", seq_id, " holds sliding block ", id, " twice");
      ++sliding_refs[id];
    }
  }
  RETURN_IF_ERROR(full_.CheckIntegrity(refs, "full"));
  RETURN_IF_ERROR(sliding_.CheckIntegrity(sliding_refs, "sliding"));
  std::unordered_set<uint64_t> entries;
  for (int32_t id = 0; id < num_blocks(); ++id) {
    const FullMeta& m = meta_[id];
    if (!full_.block(id).cached) {
      if (m.entry != 0 || !m.tokens.empty()) return bad("uncached block ", id, " keeps a cache entry");
      continue;
    }
    if (static_cast<int64_t>(m.tokens.size()) != block_size_ || m.entry == 0) return bad("cached block ", id, " malformed");
    if (!entries.insert(m.entry).second) return bad("cache entry ", m.entry, " registered twice");
  }
  for (int32_t id = 0; id < sliding_.num_blocks(); ++id) {
    const BlockPool::Block& b = sliding_.block(id);
    if (b.cached && !entries.count(b.key)) return bad("sliding block ", id, " is cached under no full block's entry");
  }
  if (!enable_prefix_caching_ && (full_.num_cached() > 0 || sliding_.num_cached() > 0)) {
    return bad("prefix caching is off but blocks are cached");
  }
  return absl::OkStatus();
}

}  // namespace moeshard
