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

void KvOwnership::Reset(int32_t block_size, int64_t num_blocks) {
  block_size_ = std::max(block_size, 1);
  blocks_.assign(static_cast<size_t>(std::max<int64_t>(num_blocks, 0)), Block{});
  seqs_.clear();
}

std::vector<uint64_t> KvOwnership::Chain(const int32_t* tokens, int64_t n) const {
  Seq s;
  s.tokens.assign(tokens, tokens + n);
  ExtendChain(s);
  return std::move(s.chain);
}

absl::Status KvOwnership::Check(const v1::StepRequest& req) const {
  std::unordered_set<int64_t> gone(req.released_seqs().begin(), req.released_seqs().end());
  gone.insert(req.preempted_seqs().begin(), req.preempted_seqs().end());
  int64_t fresh = 0;
  for (const v1::ChunkProto& c : req.chunks()) {
    RETURN_IF_ERROR(CheckChunk(c, gone));
    if (!seqs_.count(c.seq_id()) || gone.count(c.seq_id())) ++fresh;
  }
  if (num_live() + fresh > kMaxLiveSequences) {
    return absl::InvalidArgumentError(absl::StrCat("step: more than ", kMaxLiveSequences, " live sequences"));
  }
  return absl::OkStatus();
}

absl::Status KvOwnership::CheckChunk(const v1::ChunkProto& c, const std::unordered_set<int64_t>& gone) const {
  const int64_t id = c.seq_id();
  const int64_t end = c.start_pos() + c.tokens_size();
  if (c.start_pos() < 0 || c.tokens_size() == 0) return absl::OkStatus();  // ValidateStep and the runner refuse these
  const int64_t reads = BlocksFor(end, block_size_);
  if (c.block_table_size() < reads) {
    return absl::InvalidArgumentError(absl::StrCat("step: sequence ", id, "'s block table has ", c.block_table_size(),
                                                   " blocks, its positions need ", reads));
  }
  for (int64_t i = 0; i < reads; ++i) {
    const int32_t b = c.block_table(static_cast<int>(i));
    if (b < 0 || b >= static_cast<int64_t>(blocks_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("step: sequence ", id, " names KV block ", b, " outside the pool of ", blocks_.size()));
    }
  }
  auto live = [&](int64_t seq) { return seq != kNobody && !gone.count(seq) && seqs_.count(seq) > 0; };
  auto it = seqs_.find(id);
  const bool known = it != seqs_.end() && !gone.count(id);
  int64_t shared = 0;
  if (known) {
    const Seq& s = it->second;
    shared = s.shared_blocks;
    for (int64_t i = 0; i < std::min<int64_t>(reads, static_cast<int64_t>(s.table.size())); ++i) {
      if (c.block_table(static_cast<int>(i)) != s.table[i]) {
        return absl::InvalidArgumentError(absl::StrCat("step: the block table of live sequence ", id, " changed at index ", i,
                                                       " (block ", s.table[i], ", now ", c.block_table(static_cast<int>(i)), ")"));
      }
    }
  } else {
    // A new sequence reads the prefix-cache hit's blocks without writing them.
    shared = c.start_pos() / block_size_;
    std::vector<uint64_t> prefix;
    if (c.cached_prefix_size() == shared * block_size_) prefix = Chain(c.cached_prefix().data(), c.cached_prefix_size());
    for (int64_t i = 0; i < shared; ++i) {
      const int32_t b = c.block_table(static_cast<int>(i));
      const Block& blk = blocks_[b];
      if (!live(blk.writer) || blk.writer == id) continue;
      if (prefix.empty() || !blk.full || blk.digest != prefix[i]) {
        return absl::InvalidArgumentError(absl::StrCat("step: sequence ", id, " names KV block ", b, " (table index ", i,
                                                       ") of live sequence ", blk.writer,
                                                       ", and its cached prefix does not match what the block holds"));
      }
    }
  }
  // Every other block the chunk reads or writes is its own, or no live sequence's.
  for (int64_t i = shared; i < reads; ++i) {
    const int32_t b = c.block_table(static_cast<int>(i));
    const Block& blk = blocks_[b];
    if (live(blk.writer) && blk.writer != id) {
      return absl::InvalidArgumentError(absl::StrCat("step: sequence ", id, " names KV block ", b, " (table index ", i,
                                                     ") that live sequence ", blk.writer, " wrote"));
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
    if (c.table_start() != 0) return true;
  }
  return false;
}

absl::Status KvOwnership::ExpandTables(v1::StepRequest* req) const {
  std::unordered_set<int64_t> gone(req->released_seqs().begin(), req->released_seqs().end());
  gone.insert(req->preempted_seqs().begin(), req->preempted_seqs().end());
  for (v1::ChunkProto& c : *req->mutable_chunks()) {
    const int64_t from = c.table_start();
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
    whole.Reserve(static_cast<int>(from) + c.block_table_size());
    whole.Add(it->second.table.begin(), it->second.table.begin() + from);
    whole.Add(c.block_table().begin(), c.block_table().end());
    c.mutable_block_table()->Swap(&whole);
    c.set_table_start(0);
  }
  return absl::OkStatus();
}

void KvOwnership::Commit(const v1::StepRequest& req) {
  for (int64_t id : req.released_seqs()) seqs_.erase(id);
  for (int64_t id : req.preempted_seqs()) seqs_.erase(id);
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
  if (static_cast<int64_t>(s.table.size()) < reads) {
    s.table.assign(c.block_table().begin(), c.block_table().begin() + reads);
  }
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
    Block& blk = blocks_[c.block_table(static_cast<int>(i))];
    blk.writer = id;
    blk.full = s.chain_known && i < static_cast<int64_t>(s.chain.size());
    blk.digest = blk.full ? s.chain[i] : 0;
  }
}

}  // namespace moeshard
