#include "worker/follow_tokens.h"

#include "absl/strings/str_cat.h"

namespace moeshard {

absl::StatusOr<int32_t> FollowTokens::Resolve(int64_t step_id, int64_t seq_id) const {
  auto it = last_.find(seq_id);
  if (it == last_.end() || it->second.step_id != step_id - 1) {
    return absl::FailedPreconditionError(absl::StrCat("step ", step_id, ": sequence ", seq_id,
                                                      " follows a token it did not draw in step ", step_id - 1));
  }
  return it->second.token;
}

}  // namespace moeshard
