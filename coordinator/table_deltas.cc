#include "coordinator/table_deltas.h"

#include <algorithm>

namespace moeshard {

void TableDeltas::Reset(int64_t block_size) {
  std::lock_guard<std::mutex> l(mu_);
  block_size_ = std::max<int64_t>(block_size, 0);
  held_.clear();
}

void TableDeltas::Forget() {
  std::lock_guard<std::mutex> l(mu_);
  held_.clear();
}

const TableDeltas::Record* TableDeltas::Find(const StepRequest& step, const ChunkPlan& c) const {
  for (int64_t id : step.released_seqs) {
    if (id == c.seq_id) return nullptr;
  }
  for (int64_t id : step.preempted_seqs) {
    if (id == c.seq_id) return nullptr;
  }
  auto it = held_.find(c.seq_id);
  return it == held_.end() ? nullptr : &it->second;
}

int64_t TableDeltas::Held(const StepRequest& step, const ChunkPlan& c) const {
  std::lock_guard<std::mutex> l(mu_);
  const Record* r = Find(step, c);
  return r == nullptr ? 0 : std::min<int64_t>(r->full, static_cast<int64_t>(c.block_table.size()));
}

int64_t TableDeltas::HeldSliding(const StepRequest& step, const ChunkPlan& c) const {
  std::lock_guard<std::mutex> l(mu_);
  const Record* r = Find(step, c);
  return r == nullptr ? 0 : std::min<int64_t>(r->sliding, static_cast<int64_t>(c.sliding_table.size()));
}

void TableDeltas::Committed(const StepRequest& step) {
  std::lock_guard<std::mutex> l(mu_);
  if (block_size_ <= 0) return;
  for (int64_t id : step.released_seqs) held_.erase(id);
  for (int64_t id : step.preempted_seqs) held_.erase(id);
  for (const ChunkPlan& c : step.chunks) {
    if (c.start_pos < 0 || c.tokens.empty()) continue;
    const int64_t end = c.start_pos + static_cast<int64_t>(c.tokens.size());
    const int64_t reads = (end + block_size_ - 1) / block_size_;
    Record& r = held_[c.seq_id];
    r.full = std::max(r.full, std::min<int64_t>(reads, static_cast<int64_t>(c.block_table.size())));
    const int64_t sliding_reads = std::min<int64_t>(reads, static_cast<int64_t>(c.sliding_table.size()));
    int64_t released = 0;
    while (released < sliding_reads && c.sliding_table[released] < 0) ++released;
    r.sliding = std::max(r.sliding, released);
  }
}

}  // namespace moeshard
