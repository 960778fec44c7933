// Random models in the hub layout (see make_model_cmd.cc), also used directly by tests.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/formats/safetensors.h"
#include "common/model/model_config.h"
#include "nlohmann/json.hpp"

namespace moeshard {

struct RandomModelSpec {
  std::string arch = "muse_spark";  // or qwen3_moe
  std::string preset = "tiny";      // tiny | small | full-layer | full (qwen3_moe)
  bool nvfp4 = false;               // muse_spark experts in NVFP4
  uint64_t seed = 1;
  std::map<std::string, int64_t> overrides;  // layers, vocab, hidden, experts, top-k, ...
};

// The config.json a spec describes (validated by ParseHfConfig in WriteRandomModel).
absl::StatusOr<nlohmann::json> RandomModelConfig(const RandomModelSpec& spec);

// A spec's random weights in the hub layout (bf16, router f32 for muse_spark, NVFP4
// triplets when asked), in the order WriteRandomModel stores them. Every writer of a
// spec (safetensors folder, GGUF file) starts from these, so the weights agree.
struct RandomModel {
  nlohmann::json hf_config;
  ModelConfig config;
  std::vector<TensorToWrite> tensors;
};
absl::StatusOr<RandomModel> MakeRandomModel(const RandomModelSpec& spec);

absl::Status WriteRandomModel(const RandomModelSpec& spec, const std::string& out_dir);
// A byte-level BPE tokenizer.json of exactly `vocab_size` tokens (256 bytes, a few merges,
// special tokens <|endoftext|> <|im_start|> <|im_end|>, the rest reserved).
nlohmann::json ByteLevelTokenizerJson(int64_t vocab_size);

}  // namespace moeshard
