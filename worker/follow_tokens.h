// The token each sequence drew last, for lookahead steps (coordinator/scheduler.h): a chunk
// marked `follow` was planned before its token was known, and the worker that samples the
// sequence and embeds its tokens (one worker holding the whole model) puts in the token it drew
// for it in the step just before. Both the worker process and the in-process pool keep one.
// Not thread-safe: the caller runs steps one at a time.
#pragma once

#include <cstdint>
#include <unordered_map>

#include "absl/status/statusor.h"

namespace moeshard {

class FollowTokens {
 public:
  // Sequence seq_id drew `token` in step step_id.
  void Record(int64_t step_id, int64_t seq_id, int32_t token) { last_[seq_id] = {step_id, token}; }
  // The token seq_id drew in step step_id - 1; FailedPrecondition when it drew none there (a
  // chunk that follows nothing: a coordinator bug or a forged step).
  absl::StatusOr<int32_t> Resolve(int64_t step_id, int64_t seq_id) const;
  void Forget(int64_t seq_id) { last_.erase(seq_id); }
  void Clear() { last_.clear(); }
  size_t size() const { return last_.size(); }

 private:
  struct Drawn {
    int64_t step_id;
    int32_t token;
  };
  std::unordered_map<int64_t, Drawn> last_;
};

}  // namespace moeshard
