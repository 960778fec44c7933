// Random models in the hub layout (see make_model_cmd.cc), also used directly by tests.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace moeshard {

struct RandomModelSpec {
  std::string arch = "muse_spark";  // or qwen3_moe
  std::string preset = "tiny";      // tiny | small | full-layer
  bool nvfp4 = false;               // muse_spark experts in NVFP4
  uint64_t seed = 1;
  std::map<std::string, int64_t> overrides;  // layers, vocab, hidden, experts, top-k, ...
};

// The config.json a spec describes (validated by ParseHfConfig in WriteRandomModel).
absl::StatusOr<nlohmann::json> RandomModelConfig(const RandomModelSpec& spec);
absl::Status WriteRandomModel(const RandomModelSpec& spec, const std::string& out_dir);
// A byte-level BPE tokenizer.json of exactly `vocab_size` tokens (256 bytes, a few merges,
// special tokens <|endoftext|> <|im_start|> <|im_end|>, the rest reserved).
nlohmann::json ByteLevelTokenizerJson(int64_t vocab_size);

}  // namespace moeshard
