// Tables by delta: which part of each live sequence's block table the workers already hold, so
// that a step's message carries only the rest (v1::ChunkProto.table_start). At 256K tokens and
// 16-token blocks a whole table is 16,384 entries per sequence per step; a decode step adds at
// most one.
//
// What the workers hold is what worker/service/kv_ownership.h records: for each live sequence,
// the entries its chunks read (the blocks of positions [0, start_pos + tokens)). So:
//   - a step that succeeded on every worker extends the record of each of its chunks' sequences,
//     after dropping its released and preempted sequences (the worker's order);
//   - a sequence released or preempted in the step being built gets its whole table;
//   - a failed step or a new handshake forgets everything (Reset): the next step sends whole
//     tables, which the workers accept whatever they hold.
// The sliding pool's table (ChunkPlan.sliding_table, models with sliding-window layers) goes
// the same way, except that its entries turn into -1 as the window moves on: what stays true
// of the workers' record is only its leading run of -1, so a chunk sends its sliding table from
// the end of that run (at most the window's blocks plus the chunk's, however long the sequence).
// A sequence is in at most one step in flight (the scheduler's rule), so a step is always built
// after the steps that extended its sequences' records completed. Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "coordinator/worker_pool.h"

namespace moeshard {

class TableDeltas {
 public:
  // Forgets every record; block_size is the pool's (from the handshake).
  void Reset(int64_t block_size);
  // Entries of chunk c's table (of step `step`) that every worker holds: its table_start.
  int64_t Held(const StepRequest& step, const ChunkPlan& c) const;
  // The same for chunk c's sliding table: its sliding_table_start.
  int64_t HeldSliding(const StepRequest& step, const ChunkPlan& c) const;
  // `step` succeeded on every worker.
  void Committed(const StepRequest& step);
  // A step failed: nothing is known of what the workers hold.
  void Forget();

 private:
  mutable std::mutex mu_;
  int64_t block_size_ = 0;  // 0: no handshake yet, every table whole
  struct Record {
    int64_t full = 0;     // leading entries of the table the workers hold
    int64_t sliding = 0;  // leading -1 entries of the sliding table the workers hold
  };
  // The record of c's sequence, or null when it must be sent whole.
  const Record* Find(const StepRequest& step, const ChunkPlan& c) const;  // with mu_ held
  std::unordered_map<int64_t, Record> held_;
};

}  // namespace moeshard
