// Internal to moeshard_tokenizer: reads a Hugging Face tokenizer.json. Its model.vocab
// and model.merges hold some 300k small entries; building a JSON tree for them costs
// most of the load time, so a SAX reader streams them straight into vectors and builds
// a tree only for the rest of the document.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace moeshard::tokenizer_internal {

struct HfTokenizerJson {
  nlohmann::json rest;     // the document less model.vocab / model.merges when they were read below
  bool has_vocab = false;  // model.vocab was an object, read into `vocab`
  bool has_merges = false;  // model.merges was an array, read into `merges`
  std::vector<std::pair<std::string, int64_t>> vocab;       // token -> id, in file order
  std::vector<std::pair<std::string, std::string>> merges;  // "a b" strings or [a, b] pairs
};

// InvalidArgument for malformed JSON, a vocab id that is not an integer, or a merge that
// is neither "a b" nor a pair of strings.
absl::StatusOr<HfTokenizerJson> ParseHfTokenizerJson(std::string_view text);

}  // namespace moeshard::tokenizer_internal
