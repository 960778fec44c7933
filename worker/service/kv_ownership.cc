#include "worker/service/kv_ownership.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/splitmix64.h"
#include "common/status.h"

namespace moeshard {
namespace {

uint64_t Mix(uint64_t x) { return SplitMix64(x); }

int64_t BlocksFor(int64_t positions, int32_t block_size) { return (positions + block_size - 1) / block_size; }

}  // namespace

void KvOwnership::Reset(int32_t block_size, int64_t num_blocks, int64_t window) {
  block_size_ = std::max(block_size, 1);
  window_ = std::max<int64_t>(window, 0);
  blocks_.assign(static_cast<size_t>(std::max<int64_t>(num_blocks, 0)), Block{});
  seqs_.clear();
}

std::vector<uint64_t> KvOwnership::Chain(const int32_t* tokens, int64_t n) const {
  Seq s;
  s.tokens.assign(tokens, tokens + n);
  ExtendChain(s);
  return std::move(s.chain);
}

std::unordered_set<int32_t> KvOwnership::Released(const v1::StepRequest& req,
                                                  const std::unordered_set<int64_t>& gone) const {
  std::unordered_set<int32_t> released;
  for (const v1::ChunkProto& c : req.chunks()) {
    auto it = seqs_.find(c.seq_id());
    if (it == seqs_.end() || gone.count(c.seq_id())) continue;
    const std::vector<int32_t>& record = it->second.table;
    const auto& table = TableOf(c);
    const int64_t reads = BlocksFor(c.start_pos() + c.tokens_size(), block_size_);  // the entries it checks
    for (int64_t i = 0; i < std::min<int64_t>({static_cast<int64_t>(record.size()), table.size(), reads}); ++i) {
      const int32_t b = record[i];
      if (b >= 0 && table[static_cast<int>(i)] < 0 && blocks_[b].writer == c.seq_id()) released.insert(b);
    }
  }
  return released;
}

absl::Status KvOwnership::Check(const v1::StepRequest& req) const {
  if (no_pool()) {  // a one-kind model (or a worker told of no sliding pool): no chunk names one
    for (const v1::ChunkProto& c : req.chunks()) {
      if (!TableOf(c).empty() || TableStartOf(c) != 0) {
        return absl::InvalidArgumentError(absl::StrCat("step: sequence ", c.seq_id(),
                                                       " sends a sliding block table, but this worker has no sliding pool"));
      }
    }
    return absl::OkStatus();
  }
  std::unordered_set<int64_t> gone(req.released_seqs().begin(), req.released_seqs().end());
  gone.insert(req.preempted_seqs().begin(), req.preempted_seqs().end());
  const std::unordered_set<int32_t> released = Released(req, gone);
  int64_t fresh = 0;
  for (const v1::ChunkProto& c : req.chunks()) {
    RETURN_IF_ERROR(CheckChunk(c, gone, released));
    if (!seqs_.count(c.seq_id()) || gone.count(c.seq_id())) ++fresh;
  }
  if (num_live() + fresh > kMaxLiveSequences) {
    return absl::InvalidArgumentError(absl::StrCat("step: more than ", kMaxLiveSequences, " live sequences"));
  }
  return absl::OkStatus();
}

absl::Status KvOwnership::CheckChunk(const v1::ChunkProto& c, const std::unordered_set<int64_t>& gone,
                                     const std::unordered_set<int32_t>& released) const {
  const int64_t id = c.seq_id();
  const int64_t end = c.start_pos() + c.tokens_size();
  if (c.start_pos() < 0 || c.tokens_size() == 0) return absl::OkStatus();  // ValidateStep and the runner refuse these
  const char* kind = table_ == Table::kFull ? "block table" : "sliding block table";
  const auto& table = TableOf(c);
  auto entry = [&](int64_t i) { return table[static_cast<int>(i)]; };
  const int64_t reads = BlocksFor(end, block_size_), first = FirstRead(c.start_pos());
  if (table.size() < reads) {
    return absl::InvalidArgumentError(absl::StrCat("step: sequence ", id, "'s ", kind, " has ", table.size(),
                                                   " blocks, its positions need ", reads));
  }
  for (int64_t i = 0; i < reads; ++i) {
    const int32_t b = entry(i);
    if ((b < 0 && (i >= first || window_ == 0)) || b >= static_cast<int64_t>(blocks_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("step: sequence ", id, " names KV block ", b, " (", kind, " index ", i,
                                                     ") outside the pool of ", blocks_.size()));
    }
  }
  auto live = [&](int64_t seq) { return seq != kNobody && !gone.count(seq) && seqs_.count(seq) > 0; };
  // Whether block b is another live sequence's (and not released by it in this step).
  auto others = [&](int32_t b) { return live(blocks_[b].writer) && blocks_[b].writer != id && !released.count(b); };
  auto it = seqs_.find(id);
  const bool known = it != seqs_.end() && !gone.count(id);
  int64_t shared = 0;
  if (known) {
    const Seq& s = it->second;
    shared = s.shared_blocks;
    for (int64_t i = 0; i < std::min<int64_t>(reads, static_cast<int64_t>(s.table.size())); ++i) {
      if (entry(i) != s.table[i] && !(window_ > 0 && entry(i) < 0)) {  // only a release may change an entry
        return absl::InvalidArgumentError(absl::StrCat("step: the ", kind, " of live sequence ", id, " changed at index ", i,
                                                       " (block ", s.table[i], ", now ", entry(i), ")"));
      }
    }
  } else {
    // A new sequence reads the prefix-cache hit's blocks without writing them.
    shared = c.start_pos() / block_size_;
    std::vector<uint64_t> prefix;
    if (c.cached_prefix_size() == shared * block_size_) prefix = Chain(c.cached_prefix().data(), c.cached_prefix_size());
    for (int64_t i = first; i < shared; ++i) {
      const int32_t b = entry(i);
      const Block& blk = blocks_[b];
      if (!others(b)) continue;
      if (prefix.empty() || !blk.full || blk.digest != prefix[i]) {
        return absl::InvalidArgumentError(absl::StrCat("step: sequence ", id, " names KV block ", b, " (", kind, " index ", i,
                                                       ") of live sequence ", blk.writer,
                                                       ", and its cached prefix does not match what the block holds"));
      }
    }
  }
  // Every other block the chunk reads or writes is its own, or no live sequence's.
  for (int64_t i = std::max(shared, first); i < reads; ++i) {
    const int32_t b = entry(i);
    if (others(b)) {
      return absl::InvalidArgumentError(absl::StrCat("step: sequence ", id, " names KV block ", b, " (", kind, " index ", i,
                                                     ") that live sequence ", blocks_[b].writer, " wrote"));
    }
  }
  if (c.start_pos() < shared * block_size_) {
    return absl::InvalidArgumentError(absl::StrCat("step: sequence ", id, " writes position ", c.start_pos(),
                                                   " inside its shared prefix of ", shared * block_size_));
  }
  return absl::OkStatus();
}

bool KvOwnership::HasDeltas(const v1::StepRequest& req) {
  for (const v1::ChunkProto& c : req.chunks()) {
    if (c.table_start() != 0 || c.sliding_table_start() != 0) return true;
  }
  return false;
}

absl::Status KvOwnership::ExpandTables(v1::StepRequest* req) const {
  std::unordered_set<int64_t> gone(req->released_seqs().begin(), req->released_seqs().end());
  gone.insert(req->preempted_seqs().begin(), req->preempted_seqs().end());
  for (v1::ChunkProto& c : *req->mutable_chunks()) {
    const int64_t from = TableStartOf(c);
    if (from == 0) continue;
    auto it = seqs_.find(c.seq_id());
    const int64_t held = it == seqs_.end() || gone.count(c.seq_id()) ? -1 : static_cast<int64_t>(it->second.table.size());
    if (from < 0 || from > held) {
      return absl::InvalidArgumentError(absl::StrCat("step: sequence ", c.seq_id(), " sends its block table from index ",
                                                     from, " but this worker holds ",
                                                     held < 0 ? std::string("no live table for it")
                                                              : absl::StrCat(held, " entries of it")));
    }
    google::protobuf::RepeatedField<int32_t> whole;
    auto* table = table_ == Table::kFull ? c.mutable_block_table() : c.mutable_sliding_table();
    whole.Reserve(static_cast<int>(from) + table->size());
    whole.Add(it->second.table.begin(), it->second.table.begin() + from);
    whole.Add(table->begin(), table->end());
    table->Swap(&whole);
    if (table_ == Table::kFull) {
      c.set_table_start(0);
    } else {
      c.set_sliding_table_start(0);
    }
  }
  return absl::OkStatus();
}

void KvOwnership::Commit(const v1::StepRequest& req) {
  if (no_pool()) return;
  for (int64_t id : req.released_seqs()) seqs_.erase(id);
  for (int64_t id : req.preempted_seqs()) seqs_.erase(id);
  for (int32_t b : Released(req, {})) blocks_[b].writer = kNobody;  // before any chunk takes them
  for (const v1::ChunkProto& c : req.chunks()) CommitChunk(c);
}

void KvOwnership::ExtendChain(Seq& s) const {
  const int64_t full = static_cast<int64_t>(s.tokens.size()) / block_size_;
  uint64_t h = s.chain.empty() ? Mix(static_cast<uint64_t>(block_size_)) : s.chain.back();
  for (int64_t b = static_cast<int64_t>(s.chain.size()); b < full; ++b) {
    for (int64_t p = b * block_size_; p < (b + 1) * block_size_; ++p) h = Mix(h ^ static_cast<uint32_t>(s.tokens[p]));
    s.chain.push_back(h);
  }
}

void KvOwnership::CommitChunk(const v1::ChunkProto& c) {
  const int64_t id = c.seq_id(), start = c.start_pos(), end = start + c.tokens_size();
  if (start < 0 || c.tokens_size() == 0) return;
  const int64_t reads = BlocksFor(end, block_size_);
  auto [it, fresh] = seqs_.try_emplace(id);
  Seq& s = it->second;
  if (fresh) {
    s.shared_blocks = start / block_size_;
    s.chain_known = start == 0 || c.cached_prefix_size() == start;
    if (s.chain_known) s.tokens.assign(c.cached_prefix().begin(), c.cached_prefix().end());
  }
  // The entries the chunk reads, as checked (a sliding table's releases included); later ones
  // stay as recorded.
  const auto& table = TableOf(c);
  const int64_t recorded = std::min<int64_t>(reads, table.size());
  if (static_cast<int64_t>(s.table.size()) < recorded) s.table.resize(recorded);
  std::copy(table.begin(), table.begin() + recorded, s.table.begin());
  if (s.chain_known && start > static_cast<int64_t>(s.tokens.size())) s.chain_known = false;  // a gap: tokens unknown
  if (s.chain_known) {
    s.tokens.resize(start);
    s.tokens.insert(s.tokens.end(), c.tokens().begin(), c.tokens().end());
    s.chain.resize(std::min<size_t>(s.chain.size(), start / block_size_));
    ExtendChain(s);
  } else {
    s.tokens.clear();
    s.chain.clear();
  }
  for (int64_t i = start / block_size_; i < reads; ++i) {
    Block& blk = blocks_[table[static_cast<int>(i)]];
    blk.writer = id;
    blk.full = s.chain_known && i < static_cast<int64_t>(s.chain.size());
    blk.digest = blk.full ? s.chain[i] : 0;
  }
}

}  // namespace moeshard
