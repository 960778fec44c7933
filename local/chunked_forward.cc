#include "local/chunked_forward.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace moeshard {

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

absl::Status ForwardChunked(ModelRunner& runner, const std::vector<SeqChunk>& batch, std::vector<float>* logits,
                            int64_t max_step_tokens) {
  if (max_step_tokens <= 0) max_step_tokens = runner.options().max_batch_tokens;
  if (max_step_tokens <= 0) return absl::InvalidArgumentError("the step size must be positive");
  logits->clear();
  // One Forward when it fits: no copies, and the runner validates the batch as it always has.
  int64_t total = 0;
  for (const SeqChunk& c : batch) total += static_cast<int64_t>(c.tokens.size());
  if (total <= max_step_tokens) return runner.Forward(batch, logits);
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
  for (const std::vector<SeqChunk>& step : SplitIntoSteps(batch, max_step_tokens)) {
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

}  // namespace moeshard
