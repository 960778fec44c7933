// Opens a model from a path: a folder (config.json + safetensors [+ tokenizer.json,
// generation_config.json]) or a .gguf file (metadata carries config and tokenizer).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/formats/tensor_source.h"
#include "common/model/model_config.h"
#include "common/tokenizer/tokenizer.h"

namespace moeshard {

struct LoadedModel {
  std::string path;
  ModelConfig config;
  std::unique_ptr<TensorSource> source;
  std::unique_ptr<Tokenizer> tokenizer;  // null when the model ships none
};

// load_tokenizer=false skips the tokenizer (workers never need it).
absl::StatusOr<LoadedModel> LoadModel(const std::string& path, bool load_tokenizer = true);

}  // namespace moeshard
