// Byte-level BPE tokenizer (GPT-2 / Qwen family): NFC normalization (ICU), the
// pre-tokenizer split regex (PCRE2, Unicode), byte-to-unicode mapping, merges by rank,
// and added/special tokens matched verbatim before everything else.
// Immutable after creation; Encode/Decode are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace moeshard {

class GgufFile;

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false, rstrip = false;
};

// Everything needed to build a tokenizer, whichever file it came from.
struct TokenizerSpec {
  std::vector<std::string> vocab;                          // id -> token string (byte-level alphabet)
  std::vector<std::pair<std::string, std::string>> merges;  // by rank
  std::vector<AddedToken> added;
  std::string split_regex;  // pre-tokenizer pattern; empty = the Qwen2 default
  bool nfc = false;
  // ByteLevel's add_prefix_space: a space is put before each text segment (the text
  // between added tokens) that does not start with one.
  bool add_prefix_space = false;
  // BPE's ignore_merges (Llama 3): a pre-token that is itself in the vocab is one token.
  bool ignore_merges = false;
  std::optional<int32_t> bos_id, eos_id, pad_id;
};

absl::StatusOr<TokenizerSpec> TokenizerSpecFromHfJson(const std::string& tokenizer_json_path);
// tokenizer.ggml.* keys (model "gpt2"); tokenizer.ggml.pre selects the split regex.
absl::StatusOr<TokenizerSpec> TokenizerSpecFromGguf(const GgufFile& gguf);

class Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(TokenizerSpec spec);
  ~Tokenizer();

  // Added tokens in the text are always recognized (like HF's encode with add_special_tokens=False).
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text) const;
  // Byte ranges [begin, end) of a text, sorted.
  using Ranges = std::vector<std::pair<size_t, size_t>>;
  // As Encode, but a special added token (im_start, im_end, eos, ...) is recognized only where
  // it lies wholly inside one of `special_ok`; elsewhere its text is tokenized as text. Chat
  // prompts pass the template's own bytes, so that message content cannot forge roles.
  absl::StatusOr<std::vector<int32_t>> EncodeWithSpecialIn(const std::string& text, const Ranges& special_ok) const;
  // Ids out of range are an error. Special tokens are rendered as their content.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const;
  // One token's bytes (may be a partial UTF-8 sequence); used for streaming.
  absl::StatusOr<std::string> TokenBytes(int32_t id) const;
  std::optional<int32_t> TokenId(const std::string& token_content) const;

  int32_t vocab_size() const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  bool IsSpecial(int32_t id) const;

 private:
  Tokenizer();
  absl::StatusOr<std::vector<int32_t>> EncodeImpl(const std::string& text, const Ranges* special_ok) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeshard
