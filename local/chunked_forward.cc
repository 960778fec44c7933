#include "local/chunked_forward.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace moeshard {

SlidingTables::SlidingTables(const ModelRunner& runner)
    : enabled_(runner.sliding_pool()),
      window_(runner.config().sliding_window),
      block_size_(runner.options().block_size),
      alloc_(enabled_ ? runner.options().num_sliding_kv_blocks : 0) {}

absl::Status SlidingTables::Prepare(int64_t seq, SeqChunk& piece) {
  if (!enabled_) return absl::OkStatus();
  std::vector<int32_t>& t = tables_[seq];
  alloc_.ReleaseBeforeWindow(t, piece.start_pos, window_, block_size_);
  RETURN_IF_ERROR(alloc_.Reserve(t, piece.start_pos + static_cast<int64_t>(piece.tokens.size()), block_size_));
  piece.sliding_table = t;
  return absl::OkStatus();
}

void SlidingTables::Release(int64_t seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  alloc_.Free(it->second);
  tables_.erase(it);
}

std::vector<std::vector<SeqChunk>> SplitIntoSteps(const std::vector<SeqChunk>& batch, int64_t max_step_tokens) {
  std::vector<std::vector<SeqChunk>> steps(1);
  int64_t room = max_step_tokens;
  for (const SeqChunk& c : batch) {
    const int64_t n = static_cast<int64_t>(c.tokens.size());
    int64_t done = 0;
    do {
      if (room == 0) {
        steps.emplace_back();
        room = max_step_tokens;
      }
      const int64_t take = std::min(room, n - done);
      SeqChunk piece;
      piece.tokens.assign(c.tokens.begin() + done, c.tokens.begin() + done + take);
      piece.start_pos = c.start_pos + done;
      piece.block_table = c.block_table;
      piece.sliding_table = c.sliding_table;
      piece.all_logits = c.all_logits;
      steps.back().push_back(std::move(piece));
      done += take;
      room -= take;
    } while (done < n);
  }
  return steps;
}

namespace {

absl::Status ForwardSteps(ModelRunner& runner, const std::vector<SeqChunk>& batch, std::vector<float>* logits,
                          int64_t max_step_tokens, SlidingTables& sliding) {
  // One Forward when it fits: no copies, and the runner validates the batch as it always has.
  int64_t total = 0;
  for (const SeqChunk& c : batch) total += static_cast<int64_t>(c.tokens.size());
  if (total <= max_step_tokens && !sliding.enabled()) return runner.Forward(batch, logits);
  for (const SeqChunk& c : batch) {
    if (c.tokens.empty()) return absl::InvalidArgumentError("a chunk has no tokens");
  }
  const int64_t V = runner.config().vocab_size;
  // Pieces left of each chunk, to tell its last piece (the one whose last row a
  // not-all_logits chunk keeps).
  std::vector<int64_t> left(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) left[i] = static_cast<int64_t>(batch[i].tokens.size());
  size_t chunk_idx = 0;
  std::vector<float> step_logits;
  for (std::vector<SeqChunk>& step : SplitIntoSteps(batch, max_step_tokens)) {
    if (sliding.enabled()) {  // each piece's sliding table, its chunk's index as the sequence
      size_t c = chunk_idx;
      for (SeqChunk& piece : step) {
        while (left[c] == 0) ++c;
        RETURN_IF_ERROR(sliding.Prepare(static_cast<int64_t>(c), piece));
        if (piece.start_pos + static_cast<int64_t>(piece.tokens.size()) <
            batch[c].start_pos + static_cast<int64_t>(batch[c].tokens.size())) {
          continue;  // the chunk goes on in the next step (the only piece that can)
        }
        ++c;
      }
    }
    RETURN_IF_ERROR(runner.Forward(step, &step_logits));
    int64_t row = 0;
    for (const SeqChunk& piece : step) {
      while (left[chunk_idx] == 0) ++chunk_idx;  // pieces arrive in batch order
      const int64_t n = static_cast<int64_t>(piece.tokens.size());
      left[chunk_idx] -= n;
      const int64_t rows = piece.all_logits ? n : 1;
      if (piece.all_logits || left[chunk_idx] == 0) {
        if (static_cast<int64_t>(step_logits.size()) < (row + rows) * V) {
          return absl::InternalError(
              absl::StrCat("a step returned ", step_logits.size() / V, " rows, fewer than asked"));
        }
        logits->insert(logits->end(), step_logits.begin() + row * V, step_logits.begin() + (row + rows) * V);
      }
      row += rows;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ForwardChunked(ModelRunner& runner, const std::vector<SeqChunk>& batch, std::vector<float>* logits,
                            int64_t max_step_tokens, SlidingTables* sliding) {
  if (max_step_tokens <= 0) max_step_tokens = runner.options().max_batch_tokens;
  if (max_step_tokens <= 0) return absl::InvalidArgumentError("the step size must be positive");
  logits->clear();
  if (sliding != nullptr) return ForwardSteps(runner, batch, logits, max_step_tokens, *sliding);
  SlidingTables own(runner);
  return ForwardSteps(runner, batch, logits, max_step_tokens, own);  // own's blocks go with it
}

}  // namespace moeshard
