// What one worker owns of a model: a contiguous range of layers (pipeline stage) and a
// tensor-parallel slice of each of them (KV-head groups of attention, a contiguous range
// of experts, a slice of dense MLPs). Computed by the coordinator's plan; validated by the
// plan and by the worker that loads it.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/model/model_config.h"

namespace moeshard {

struct ShardSpec {
  int64_t layer_begin = 0, layer_end = 0;  // [begin, end)
  int tp_rank = 0, tp_size = 1;
  bool first_stage = true;  // embeds tokens
  bool last_stage = true;   // final norm, LM head, sampling

  std::string DebugString() const {
    return absl::StrCat("layers [", layer_begin, ", ", layer_end, ") tp ", tp_rank, "/", tp_size,
                        first_stage ? " first" : "", last_stage ? " last" : "");
  }
};

// Validates that the shard's layer range fits the model and that its tensor-parallel slicing
// divides it (KV heads, experts, the dense intermediate size), or names what does not.
absl::Status ValidateShard(const ModelConfig& c, const ShardSpec& s);

}  // namespace moeshard
