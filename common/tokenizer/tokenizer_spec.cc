// TokenizerSpec from a Hugging Face tokenizer.json or from a GGUF file's tokenizer.ggml.*
// keys. Only what Tokenizer can run exactly is accepted: a BPE model with byte-level
// pre-tokenization; anything else is refused with a status naming it, never approximated.
#include <filesystem>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/formats/gguf.h"
#include "common/mapped_file.h"
#include "common/status.h"
#include "common/tokenizer/hf_json_reader.h"
#include "common/tokenizer/split_regex.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace moeshard {
namespace ti = tokenizer_internal;
namespace {

using Json = nlohmann::json;

constexpr int64_t kMaxTokenId = (1 << 24) - 1;

absl::StatusOr<Json> ParseJsonFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not valid JSON: ", e.what()));
  }
}

std::string TypeOf(const Json& j) {
  const auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

bool BoolField(const Json& j, const char* key, bool default_value) {
  const auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : default_value;
}

absl::Status ParseBpeModel(const Json& model, ti::HfTokenizerJson* doc, TokenizerSpec* spec) {
  if (!model.is_object()) {
    return absl::InvalidArgumentError("\"model\" is missing or not an object");
  }
  if (model.contains("type") && TypeOf(model) != "BPE") {
    return absl::UnimplementedError(
        absl::StrCat("model type '", TypeOf(model), "' is not supported (only BPE)"));
  }
  if (BoolField(model, "byte_fallback", false)) {
    return absl::UnimplementedError("BPE byte_fallback is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto it = model.find(key);
    if (it != model.end() && it->is_string() && !it->get<std::string>().empty()) {
      return absl::UnimplementedError(absl::StrCat("BPE ", key, " is not supported"));
    }
  }
  if (const auto it = model.find("dropout");
      it != model.end() && it->is_number() && it->get<double>() > 0) {
    return absl::UnimplementedError("BPE dropout is not supported");
  }
  spec->ignore_merges = BoolField(model, "ignore_merges", false);

  if (!doc->has_vocab || doc->vocab.empty()) {
    return absl::InvalidArgumentError("model.vocab is missing, empty or not an object");
  }
  for (auto& [token, id] : doc->vocab) {
    if (id < 0 || id > kMaxTokenId) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.vocab['", token, "'] = ", id, " is not a valid id"));
    }
    if (static_cast<size_t>(id) >= spec->vocab.size()) spec->vocab.resize(id + 1);
    if (token.empty() || !spec->vocab[id].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.vocab: empty token or id ", id, " used twice"));
    }
    spec->vocab[id] = std::move(token);
  }
  if (!doc->has_merges) {
    return absl::InvalidArgumentError("model.merges is missing or not an array");
  }
  spec->merges = std::move(doc->merges);
  return absl::OkStatus();
}

absl::Status ParseAddedTokens(const Json& root, TokenizerSpec* spec) {
  const auto added = root.find("added_tokens");
  if (added == root.end() || added->is_null()) return absl::OkStatus();
  if (!added->is_array()) return absl::InvalidArgumentError("added_tokens is not an array");
  for (const Json& t : *added) {
    const auto id = t.find("id");
    const auto content = t.find("content");
    if (!t.is_object() || id == t.end() || !id->is_number_integer() || id->get<int64_t>() < 0 ||
        id->get<int64_t>() > kMaxTokenId || content == t.end() || !content->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("added_tokens entry ", t.dump(), " is malformed"));
    }
    AddedToken token;
    token.id = static_cast<int32_t>(id->get<int64_t>());
    token.content = content->get<std::string>();
    token.special = BoolField(t, "special", false);
    token.lstrip = BoolField(t, "lstrip", false);
    token.rstrip = BoolField(t, "rstrip", false);
    spec->added.push_back(std::move(token));
  }
  return absl::OkStatus();
}

absl::Status ParseNormalizer(const Json& root, TokenizerSpec* spec) {
  const auto it = root.find("normalizer");
  if (it == root.end() || it->is_null()) return absl::OkStatus();
  std::vector<const Json*> steps = {&*it};
  if (TypeOf(*it) == "Sequence") {
    const auto list = it->find("normalizers");
    if (list == it->end() || !list->is_array()) {
      return absl::InvalidArgumentError("normalizer Sequence without a list");
    }
    steps.clear();
    for (const Json& n : *list) steps.push_back(&n);
  }
  for (const Json* n : steps) {
    if (!n->is_object() || TypeOf(*n) != "NFC") {
      return absl::UnimplementedError(absl::StrCat("normalizer '",
                                                   n->is_object() ? TypeOf(*n) : n->dump(),
                                                   "' is not supported (only NFC)"));
    }
    spec->nfc = true;
  }
  return absl::OkStatus();
}

// Accepts Split(pattern, Isolated) then ByteLevel(use_regex=false), or ByteLevel alone.
absl::Status ParsePreTokenizer(const Json& root, TokenizerSpec* spec) {
  const auto it = root.find("pre_tokenizer");
  if (it == root.end() || !it->is_object()) {
    return absl::UnimplementedError("a ByteLevel pre_tokenizer is required");
  }
  std::vector<const Json*> steps = {&*it};
  if (TypeOf(*it) == "Sequence") {
    const auto list = it->find("pretokenizers");
    if (list == it->end() || !list->is_array()) {
      return absl::InvalidArgumentError("pre_tokenizer Sequence without a list");
    }
    steps.clear();
    for (const Json& p : *list) steps.push_back(&p);
  }
  std::optional<std::string> pattern;
  bool byte_level = false;
  for (const Json* p : steps) {
    const std::string type = p->is_object() ? TypeOf(*p) : "";
    if (byte_level) {
      return absl::UnimplementedError(absl::StrCat("pre-tokenizer '", type, "' after ByteLevel"));
    }
    if (type == "Split") {
      const auto pat = p->find("pattern");
      if (pattern.has_value() || pat == p->end() || !pat->is_object()) {
        return absl::UnimplementedError("only one Split pre-tokenizer with a pattern is supported");
      }
      if (pat->contains("Regex") && (*pat)["Regex"].is_string()) {
        pattern = (*pat)["Regex"].get<std::string>();
      } else if (pat->contains("String") && (*pat)["String"].is_string()) {
        pattern = ti::QuoteRegex((*pat)["String"].get<std::string>());
      } else {
        return absl::InvalidArgumentError("Split pattern is neither Regex nor String");
      }
      const auto behavior = p->find("behavior");
      if (behavior == p->end() || *behavior != "Isolated" || BoolField(*p, "invert", false)) {
        return absl::UnimplementedError(
            "Split is supported only with behavior Isolated, not inverted");
      }
    } else if (type == "ByteLevel") {
      byte_level = true;
      const bool prefix_space = BoolField(*p, "add_prefix_space", true);
      if (BoolField(*p, "use_regex", true)) {
        if (pattern.has_value()) {
          return absl::UnimplementedError("Split followed by ByteLevel with use_regex");
        }
        pattern = ti::kGpt2Pattern;
        spec->add_prefix_space = prefix_space;
      } else if (prefix_space) {
        if (pattern.has_value()) {
          return absl::UnimplementedError("ByteLevel add_prefix_space after a Split");
        }
        spec->add_prefix_space = true;
      }
    } else {
      return absl::UnimplementedError(absl::StrCat("pre-tokenizer '", type, "' is not supported"));
    }
  }
  if (!byte_level) return absl::UnimplementedError("a ByteLevel pre_tokenizer is required");
  spec->split_regex = pattern.value_or(ti::kWholeTextPattern);
  return absl::OkStatus();
}

// bos/eos/pad from tokenizer_config.json beside tokenizer.json, when there is one.
absl::Status ReadSpecialIds(const std::string& tokenizer_json_path, TokenizerSpec* spec) {
  const std::filesystem::path config_path =
      std::filesystem::path(tokenizer_json_path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(config_path, ec)) return absl::OkStatus();
  ASSIGN_OR_RETURN(const Json config, ParseJsonFile(config_path.string()));
  if (!config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path.string(), " is not an object"));
  }
  const auto find_id = [&](const char* key) -> std::optional<int32_t> {
    const auto it = config.find(key);
    if (it == config.end()) return std::nullopt;
    const Json* v = &*it;
    if (v->is_object() && v->contains("content")) v = &(*v)["content"];
    if (!v->is_string()) return std::nullopt;
    const std::string& content = v->get_ref<const std::string&>();
    for (const AddedToken& t : spec->added) {
      if (t.content == content) return t.id;
    }
    for (size_t id = 0; id < spec->vocab.size(); ++id) {
      if (spec->vocab[id] == content) return static_cast<int32_t>(id);
    }
    return std::nullopt;
  };
  spec->bos_id = find_id("bos_token");
  spec->eos_id = find_id("eos_token");
  spec->pad_id = find_id("pad_token");
  return absl::OkStatus();
}

absl::Status CheckDecoder(const Json& root) {
  const auto decoder = root.find("decoder");
  if (decoder == root.end() || decoder->is_null() || TypeOf(*decoder) == "ByteLevel") {
    return absl::OkStatus();
  }
  return absl::UnimplementedError(
      absl::StrCat("decoder '", TypeOf(*decoder), "' is not supported (only ByteLevel)"));
}

absl::Status ParseTokenizerJson(ti::HfTokenizerJson* doc, TokenizerSpec* spec) {
  const Json& root = doc->rest;
  if (!root.is_object()) return absl::InvalidArgumentError("top level is not an object");
  const auto model = root.find("model");
  if (model == root.end()) return absl::InvalidArgumentError("no \"model\"");
  RETURN_IF_ERROR(ParseBpeModel(*model, doc, spec));
  RETURN_IF_ERROR(ParseAddedTokens(root, spec));
  RETURN_IF_ERROR(ParseNormalizer(root, spec));
  RETURN_IF_ERROR(ParsePreTokenizer(root, spec));
  return CheckDecoder(root);
}

}  // namespace

absl::StatusOr<TokenizerSpec> TokenizerSpecFromHfJson(const std::string& tokenizer_json_path) {
  ASSIGN_OR_RETURN(const std::unique_ptr<MappedFile> file, MappedFile::Open(tokenizer_json_path));
  auto doc = ti::ParseHfTokenizerJson(
      std::string_view(reinterpret_cast<const char*>(file->data()), file->size()));
  TokenizerSpec spec;
  absl::Status status = doc.status();
  if (status.ok()) {
    try {  // the parsers check types first; this only guards against a missed check
      status = ParseTokenizerJson(&*doc, &spec);
    } catch (const Json::exception& e) {
      status = absl::InvalidArgumentError(e.what());
    }
  }
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat(tokenizer_json_path, ": ", status.message()));
  }
  RETURN_IF_ERROR(ReadSpecialIds(tokenizer_json_path, &spec));
  return spec;
}

absl::StatusOr<TokenizerSpec> TokenizerSpecFromGguf(const GgufFile& gguf) {
  ASSIGN_OR_RETURN(const std::string model, gguf.GetString("tokenizer.ggml.model"));
  if (model != "gpt2") {
    return absl::UnimplementedError(absl::StrCat(
        "tokenizer.ggml.model '", model, "' is not supported (only byte-level BPE 'gpt2')"));
  }
  TokenizerSpec spec;
  std::string pre_name = "default";
  if (gguf.Has("tokenizer.ggml.pre")) {
    ASSIGN_OR_RETURN(pre_name, gguf.GetString("tokenizer.ggml.pre"));
  }
  if (pre_name == "qwen2") {
    spec.split_regex = ti::kQwen2Pattern;
    spec.nfc = true;
  } else if (pre_name == "llama-bpe") {
    spec.split_regex = ti::kLlama3Pattern;
    spec.ignore_merges = true;  // as llama.cpp does for Llama 3
  } else if (pre_name == "gpt2" || pre_name == "default") {
    spec.split_regex = ti::kGpt2Pattern;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.ggml.pre '", pre_name, "' is not supported"));
  }

  ASSIGN_OR_RETURN(const std::vector<std::string>* tokens,
                   gguf.GetStringArray("tokenizer.ggml.tokens"));
  if (tokens->empty() || tokens->size() > static_cast<size_t>(kMaxTokenId) + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.ggml.tokens has ", tokens->size(), " entries"));
  }
  spec.vocab = *tokens;
  if (gguf.Has("tokenizer.ggml.token_type")) {
    ASSIGN_OR_RETURN(const std::vector<int64_t>* types,
                     gguf.GetIntArray("tokenizer.ggml.token_type"));
    if (types->size() != tokens->size()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.token_type has ",
                                                     types->size(), " entries for ", tokens->size(),
                                                     " tokens"));
    }
    for (size_t id = 0; id < types->size(); ++id) {
      const int64_t type = (*types)[id];
      if (type != 3 && type != 4) continue;  // 3 = control, 4 = user defined
      spec.added.push_back(
          {.id = static_cast<int32_t>(id), .content = (*tokens)[id], .special = type == 3});
    }
  }

  ASSIGN_OR_RETURN(const std::vector<std::string>* merges,
                   gguf.GetStringArray("tokenizer.ggml.merges"));
  spec.merges.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const std::string& s = (*merges)[rank];
    const size_t space = s.find(' ', 1);  // from 1, as llama.cpp: the left part may be " "
    if (space == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.ggml.merges[", rank, "] '", s, "' has no space"));
    }
    spec.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
  }

  const std::pair<const char*, std::optional<int32_t>*> id_keys[] = {
      {"tokenizer.ggml.bos_token_id", &spec.bos_id},
      {"tokenizer.ggml.eos_token_id", &spec.eos_id},
      {"tokenizer.ggml.padding_token_id", &spec.pad_id}};
  for (const auto& [key, out] : id_keys) {
    if (!gguf.Has(key)) continue;
    ASSIGN_OR_RETURN(const int64_t id, gguf.GetInt(key));
    if (id < 0 || id >= static_cast<int64_t>(tokens->size())) {
      return absl::InvalidArgumentError(absl::StrCat(key, " = ", id, " is not a token id"));
    }
    *out = static_cast<int32_t>(id);
  }
  return spec;
}

}  // namespace moeshard
