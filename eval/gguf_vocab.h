// The tokenizer.ggml.* metadata of a byte-level BPE tokenizer, built from a Hugging Face
// tokenizer.json the way llama.cpp's convert_hf_to_gguf.py builds it (_set_vocab_gpt2 and
// gguf.SpecialVocab):
//   tokens      id -> token text for every id below the model's vocab size; ids that the
//               tokenizer does not use become "[PAD<id>]" of type UNUSED.
//   token_type  NORMAL (1) for model.vocab entries, CONTROL (3) for added tokens that are
//               special or look special ("<|...|>"), USER_DEFINED (4) for other added
//               tokens, UNUSED (5) for padding.
//   merges      "left right", by rank (pair lists are joined with a space).
//   bos/eos/padding ids: tokenizer_config.json's bos_token / eos_token / pad_token first,
//               then config.json's bos_token_id / eos_token_id / pad_token_id for any not
//               set; add_bos_token from tokenizer_config.json (false when absent, which is
//               llama.cpp's default for the qwen2 pre-tokenizer too); chat_template as given.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/formats/gguf_writer.h"
#include "nlohmann/json.hpp"

namespace moeshard {

struct GgufVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;
  std::vector<std::string> merges;
  std::optional<int32_t> bos_id, eos_id, pad_id;
  bool add_bos = false;
  std::string chat_template;  // empty = none
};

// llama.cpp's token types (gguf-py TokenType).
enum GgufTokenType : int32_t { kTokenNormal = 1, kTokenControl = 3, kTokenUserDefined = 4, kTokenUnused = 5 };

// `tokenizer_config` and `config` may be null (absent). `vocab_size` 0 = one past the
// largest id the tokenizer uses; a size below that is an error.
absl::StatusOr<GgufVocab> GgufVocabFromHf(const nlohmann::json& tokenizer, const nlohmann::json& tokenizer_config,
                                          const nlohmann::json& config, int64_t vocab_size);

// Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json and
// DIR/config.json. `vocab_size` 0 = config.json's vocab_size when it has one, else the
// tokenizer's own size.
absl::StatusOr<GgufVocab> GgufVocabFromDir(const std::string& dir, int64_t vocab_size);

// tokenizer.ggml.model "gpt2", pre "qwen2", and the fields above.
void AddVocabToGguf(const GgufVocab& vocab, GgufWriter* writer);

}  // namespace moeshard
