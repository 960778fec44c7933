// Builds GGUF tokenizer metadata from Hugging Face tokenizer files; see gguf_vocab.h.
#include "eval/gguf_vocab.h"

#include <filesystem>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/mapped_file.h"
#include "common/status.h"

namespace moeshard {
namespace {

using json = nlohmann::json;

// The largest id a tokenizer.json uses, or -1.
int64_t MaxId(const json& tok) {
  int64_t max_id = -1;
  for (const auto& [text, id] : tok["model"]["vocab"].items()) max_id = std::max<int64_t>(max_id, id.get<int64_t>());
  if (tok.contains("added_tokens") && tok["added_tokens"].is_array()) {
    for (const json& t : tok["added_tokens"]) max_id = std::max<int64_t>(max_id, t.value("id", int64_t{-1}));
  }
  return max_id;
}

absl::Status CheckShape(const json& tok) {
  if (!tok.is_object() || !tok.contains("model") || !tok["model"].is_object()) {
    return absl::InvalidArgumentError("tokenizer.json has no \"model\" object");
  }
  const json& m = tok["model"];
  if (m.value("type", "") != "BPE") return absl::UnimplementedError("only BPE tokenizers can be written to GGUF");
  if (!m.contains("vocab") || !m["vocab"].is_object())
    return absl::InvalidArgumentError("tokenizer.json: model.vocab is not an object");
  if (!m.contains("merges") || !m["merges"].is_array())
    return absl::InvalidArgumentError("tokenizer.json: model.merges is not an array");
  for (const auto& [text, id] : m["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: model.vocab['", text, "'] is not an id"));
    }
  }
  if (tok.contains("added_tokens") && !tok["added_tokens"].is_null()) {
    if (!tok["added_tokens"].is_array())
      return absl::InvalidArgumentError("tokenizer.json: added_tokens is not an array");
    for (const json& t : tok["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 ||
          !t.contains("content") || !t["content"].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: added token ", t.dump(), " is malformed"));
      }
    }
  }
  return absl::OkStatus();
}

// convert_hf_to_gguf.py's does_token_look_special, for the byte-level case.
bool LooksSpecial(const std::string& t) {
  return (absl::StartsWith(t, "<|") && absl::EndsWith(t, "|>")) || t == "<pad>" || t == "<mask>";
}

// The content of tokenizer_config.json's `key` ("<|x|>" or {"content": "<|x|>"}), if any.
std::optional<std::string> ConfigToken(const json& tc, const char* key) {
  if (!tc.is_object() || !tc.contains(key)) return std::nullopt;
  const json* v = &tc[key];
  if (v->is_object() && v->contains("content")) v = &(*v)["content"];
  if (!v->is_string()) return std::nullopt;
  return v->get<std::string>();
}

absl::StatusOr<json> ReadJson(const std::filesystem::path& p, bool required) {
  std::error_code ec;
  if (!required && !std::filesystem::exists(p, ec)) return json();
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(p.string()));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(p.string(), ": not valid JSON"));
  return j;
}

}  // namespace

absl::StatusOr<GgufVocab> GgufVocabFromHf(const json& tok, const json& tc, const json& config, int64_t vocab_size) {
  RETURN_IF_ERROR(CheckShape(tok));
  const int64_t natural = MaxId(tok) + 1;
  if (vocab_size == 0) vocab_size = natural;
  if (vocab_size < natural) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tokenizer uses ids up to ", natural - 1, ", more than a vocabulary of ", vocab_size));
  }
  GgufVocab v;
  v.tokens.assign(vocab_size, "");
  v.token_types.assign(vocab_size, kTokenUnused);
  std::vector<bool> used(vocab_size, false);
  for (const auto& [text, id] : tok["model"]["vocab"].items()) {
    v.tokens[id.get<int64_t>()] = text;
    v.token_types[id.get<int64_t>()] = kTokenNormal;
    used[id.get<int64_t>()] = true;
  }
  std::map<std::string, int32_t> added_ids;
  if (tok.contains("added_tokens") && tok["added_tokens"].is_array()) {
    for (const json& t : tok["added_tokens"]) {
      const int64_t id = t["id"].get<int64_t>();
      const std::string content = t["content"].get<std::string>();
      v.tokens[id] = content;
      const bool special = t.value("special", false) || LooksSpecial(content);
      v.token_types[id] = special ? kTokenControl : kTokenUserDefined;
      used[id] = true;
      added_ids[content] = static_cast<int32_t>(id);
    }
  }
  for (int64_t id = 0; id < vocab_size; ++id) {
    if (!used[id]) v.tokens[id] = absl::StrCat("[PAD", id, "]");
  }
  for (const json& m : tok["model"]["merges"]) {
    if (m.is_string()) {
      v.merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      v.merges.push_back(absl::StrCat(m[0].get<std::string>(), " ", m[1].get<std::string>()));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: merge ", m.dump(), " is malformed"));
    }
  }
  // Special ids: tokenizer_config.json names them, config.json fills the gaps.
  const std::pair<const char*, std::optional<int32_t>*> specials[] = {
      {"bos", &v.bos_id}, {"eos", &v.eos_id}, {"pad", &v.pad_id}};
  for (const auto& [typ, out] : specials) {
    if (auto content = ConfigToken(tc, absl::StrCat(typ, "_token").c_str())) {
      if (auto it = added_ids.find(*content); it != added_ids.end()) *out = it->second;
    }
    const std::string key = absl::StrCat(typ, "_token_id");
    if (!out->has_value() && config.is_object() && config.contains(key) && config[key].is_number_integer()) {
      const int64_t id = config[key].get<int64_t>();
      if (id >= 0 && id < vocab_size) *out = static_cast<int32_t>(id);
    }
  }
  if (tc.is_object()) {
    if (tc.contains("add_bos_token") && tc["add_bos_token"].is_boolean()) v.add_bos = tc["add_bos_token"].get<bool>();
    if (tc.contains("chat_template") && tc["chat_template"].is_string()) v.chat_template = tc["chat_template"];
  }
  return v;
}

absl::StatusOr<GgufVocab> GgufVocabFromDir(const std::string& dir, int64_t vocab_size) {
  namespace fs = std::filesystem;
  ASSIGN_OR_RETURN(json tok, ReadJson(fs::path(dir) / "tokenizer.json", /*required=*/true));
  ASSIGN_OR_RETURN(json tc, ReadJson(fs::path(dir) / "tokenizer_config.json", /*required=*/false));
  ASSIGN_OR_RETURN(json config, ReadJson(fs::path(dir) / "config.json", /*required=*/false));
  if (vocab_size == 0 && config.is_object() && config.contains("vocab_size") &&
      config["vocab_size"].is_number_integer()) {
    vocab_size = config["vocab_size"].get<int64_t>();
  }
  absl::StatusOr<GgufVocab> v = GgufVocabFromHf(tok, tc, config, vocab_size);
  if (!v.ok()) return absl::Status(v.status().code(), absl::StrCat(dir, ": ", v.status().message()));
  return v;
}

void AddVocabToGguf(const GgufVocab& v, GgufWriter* w) {
  w->AddString("tokenizer.ggml.model", "gpt2");
  w->AddString("tokenizer.ggml.pre", "qwen2");
  w->AddStringArray("tokenizer.ggml.tokens", v.tokens);
  w->AddI32Array("tokenizer.ggml.token_type", v.token_types);
  w->AddStringArray("tokenizer.ggml.merges", v.merges);
  if (v.bos_id) w->AddU32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*v.bos_id));
  if (v.eos_id) w->AddU32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(*v.eos_id));
  if (v.pad_id) w->AddU32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(*v.pad_id));
  w->AddBool("tokenizer.ggml.add_bos_token", v.add_bos);
  if (!v.chat_template.empty()) w->AddString("tokenizer.chat_template", v.chat_template);
}

}  // namespace moeshard
