#include "common/model/model_loader.h"

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/formats/gguf.h"
#include "common/formats/safetensors.h"
#include "common/mapped_file.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace moeshard {
namespace fs = std::filesystem;

namespace {

// eos ids from generation_config.json, added to those of config.json.
void ReadGenerationConfig(const fs::path& dir, ModelConfig& c) {
  auto text = ReadFileToString((dir / "generation_config.json").string());
  if (!text.ok()) return;
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("eos_token_id")) return;
  auto add = [&](const nlohmann::json& v) {
    if (v.is_number_integer() && std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), v.get<int32_t>()) == c.eos_token_ids.end()) {
      c.eos_token_ids.push_back(v.get<int32_t>());
    }
  };
  if (j["eos_token_id"].is_array()) {
    for (auto& v : j["eos_token_id"]) add(v);
  } else {
    add(j["eos_token_id"]);
  }
}

}  // namespace

absl::StatusOr<LoadedModel> LoadModel(const std::string& path, bool load_tokenizer) {
  LoadedModel m;
  m.path = path;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    if (absl::EndsWith(path, ".safetensors")) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": give the model folder (with config.json), not one .safetensors file"));
    }
    ASSIGN_OR_RETURN(auto g, GgufFile::Open(path));
    ASSIGN_OR_RETURN(m.config, ConfigFromGguf(*g));
    if (load_tokenizer) {
      ASSIGN_OR_RETURN(auto spec, TokenizerSpecFromGguf(*g));
      ASSIGN_OR_RETURN(m.tokenizer, Tokenizer::Create(std::move(spec)));
    }
    m.source = std::move(g);
    return m;
  }
  if (!fs::is_directory(path, ec)) return absl::NotFoundError(absl::StrCat("model path ", path, " does not exist"));
  fs::path dir(path);
  ASSIGN_OR_RETURN(m.config, LoadHfConfig((dir / "config.json").string()));
  ReadGenerationConfig(dir, m.config);
  ASSIGN_OR_RETURN(auto st, SafetensorsCheckpoint::Open(path));
  m.source = std::move(st);
  if (load_tokenizer && fs::exists(dir / "tokenizer.json")) {
    ASSIGN_OR_RETURN(auto spec, TokenizerSpecFromHfJson((dir / "tokenizer.json").string()));
    ASSIGN_OR_RETURN(m.tokenizer, Tokenizer::Create(std::move(spec)));
    if (m.config.eos_token_ids.empty() && m.tokenizer->eos_id()) m.config.eos_token_ids.push_back(*m.tokenizer->eos_id());
  }
  return m;
}

}  // namespace moeshard
