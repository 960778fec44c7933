#include "worker/kv_copy_plan.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace moeshard {

absl::StatusOr<KvCopyPlan> PlanKvCopy(const std::vector<SeqChunk>& batch, int64_t block_size, int64_t window,
                                      bool sliding_tables) {
  if (block_size <= 0) return absl::InvalidArgumentError("PlanKvCopy: block_size must be positive");
  if (window < 0) return absl::InvalidArgumentError("PlanKvCopy: negative window");
  KvCopyPlan plan;
  for (size_t c = 0; c < batch.size(); ++c) {
    const SeqChunk& ch = batch[c];
    const int64_t n = static_cast<int64_t>(ch.tokens.size());
    if (n == 0) continue;
    const std::vector<int32_t>& table = sliding_tables ? ch.sliding_table : ch.block_table;
    const int64_t end = ch.start_pos + n;
    const int64_t first = window > 0 ? std::max<int64_t>(0, ch.start_pos - window + 1) : 0;
    const int64_t b_lo = first / block_size, b_hi = (end - 1) / block_size;
    if (static_cast<int64_t>(table.size()) <= b_hi) {
      return absl::InvalidArgumentError(absl::StrCat("PlanKvCopy: chunk ", c, "'s table has ", table.size(),
                                                     " entries; positions up to ", end - 1, " need ", b_hi + 1));
    }
    const int64_t offset = static_cast<int64_t>(plan.tables.size());
    for (int64_t b = 0; b <= b_hi; ++b) {
      if (b < b_lo) {
        plan.tables.push_back(-1);
        continue;
      }
      if (table[b] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("PlanKvCopy: chunk ", c, " needs block ", b, " (positions from ", first, "), which is -1"));
      }
      plan.tables.push_back(static_cast<int32_t>(plan.src_blocks.size()));
      plan.src_blocks.push_back(table[b]);
    }
    plan.table_offset.insert(plan.table_offset.end(), n, static_cast<int32_t>(offset));
  }
  return plan;
}

}  // namespace moeshard
