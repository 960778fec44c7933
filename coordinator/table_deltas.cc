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

int64_t TableDeltas::Held(const StepRequest& step, const ChunkPlan& c) const {
  for (int64_t id : step.released_seqs) {
    if (id == c.seq_id) return 0;
  }
  for (int64_t id : step.preempted_seqs) {
    if (id == c.seq_id) return 0;
  }
  std::lock_guard<std::mutex> l(mu_);
  auto it = held_.find(c.seq_id);
  if (it == held_.end()) return 0;
  return std::min<int64_t>(it->second, static_cast<int64_t>(c.block_table.size()));
}

void TableDeltas::Committed(const StepRequest& step) {
  std::lock_guard<std::mutex> l(mu_);
  if (block_size_ <= 0) return;
  for (int64_t id : step.released_seqs) held_.erase(id);
  for (int64_t id : step.preempted_seqs) held_.erase(id);
  for (const ChunkPlan& c : step.chunks) {
    if (c.start_pos < 0 || c.tokens.empty()) continue;
    const int64_t end = c.start_pos + static_cast<int64_t>(c.tokens.size());
    const int64_t reads = std::min<int64_t>((end + block_size_ - 1) / block_size_, static_cast<int64_t>(c.block_table.size()));
    int64_t& h = held_[c.seq_id];
    h = std::max(h, reads);
  }
}

}  // namespace moeshard
