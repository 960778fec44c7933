// Which KV blocks a prefill step's queries can see, laid out as a compact copy: the GPU runner's
// FP8 prefill path dequantizes exactly these blocks to bf16 once per layer and runs the bf16
// attention kernel on the copy, through tables that point into it (kernels/cuda/kv_dequant.cu).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model_runner.h"

namespace moeshard {

// For one pool of tables (a chunk's block_table, or its sliding_table):
//   src_blocks  the physical blocks to copy, in copy order (copy block i <- src_blocks[i]);
//   tables      per chunk, entries 0 .. (last position's block): the copy's block index, or -1
//               before the first block its queries can see (never read);
//   table_offset per token of the step (the batch's order): where its chunk's table starts.
struct KvCopyPlan {
  std::vector<int32_t> src_blocks, tables, table_offset;
};

// The plan for a batch: every key position [first, start_pos + n) of each chunk, where first is
// 0 (window 0) or start_pos - window + 1 (a sliding-window layer: the first key its first query
// sees). `sliding_tables` reads each chunk's sliding_table instead of its block_table. Errors on
// a table too short for the chunk or a needed entry that is -1.
absl::StatusOr<KvCopyPlan> PlanKvCopy(const std::vector<SeqChunk>& batch, int64_t block_size, int64_t window,
                                      bool sliding_tables);

}  // namespace moeshard
