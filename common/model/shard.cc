#include "common/model/shard.h"

#include "absl/strings/str_cat.h"

namespace moeshard {

absl::Status ValidateShard(const ModelConfig& c, const ShardSpec& s) {
  if (s.layer_begin < 0 || s.layer_end > c.num_layers || s.layer_begin >= s.layer_end) {
    return absl::InvalidArgumentError(absl::StrCat("shard layers [", s.layer_begin, ", ", s.layer_end,
                                                   ") do not fit a model of ", c.num_layers, " layers"));
  }
  if (s.tp_size < 1 || s.tp_rank < 0 || s.tp_rank >= s.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("tensor-parallel rank ", s.tp_rank, " of ", s.tp_size));
  }
  if (c.num_kv_heads % s.tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel over ", s.tp_size, " workers needs it to divide the ",
                                                   c.num_kv_heads, " KV heads"));
  }
  if (c.num_experts > 0 && c.num_experts % s.tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel over ", s.tp_size, " workers needs it to divide the ",
                                                   c.num_experts, " experts"));
  }
  if (c.dense_intermediate > 0 && c.dense_intermediate % s.tp_size != 0) {
    for (auto& l : c.layers) {
      if (!l.moe) {
        return absl::InvalidArgumentError(absl::StrCat("tensor parallel over ", s.tp_size, " workers needs it to divide intermediate_size ",
                                                       c.dense_intermediate));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace moeshard
