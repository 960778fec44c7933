// Internal to moeshard_tokenizer: the pre-tokenizer split, a PCRE2 pattern compiled in
// UTF + Unicode-property mode (\p{L}, \s and case folding follow Unicode), JIT when the
// platform has it. Compiled once; Split is const and thread-safe (match data per call).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct pcre2_real_code_8;  // pcre2_code_8, from pcre2.h

namespace moeshard::tokenizer_internal {

// Qwen2/Qwen3 (tokenizer.json's Split regex; llama.cpp's pre "qwen2").
inline constexpr char kQwen2Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Llama 3 (llama.cpp's pre "llama-bpe"): digits in runs of up to three.
inline constexpr char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// GPT-2 (ByteLevel pre-tokenizer with use_regex=true; llama.cpp's pre "gpt2").
inline constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// One piece per segment (a ByteLevel pre-tokenizer without any split).
inline constexpr char kWholeTextPattern[] = R"([\s\S]+)";

// `literal` escaped so that PCRE2 matches it verbatim.
std::string QuoteRegex(std::string_view literal);

class SplitRegex {
 public:
  // `onig_pattern` is meant as Oniguruma reads it (Hugging Face's engine); \s and \S
  // are rewritten to its White_Space set. InvalidArgument with PCRE2's message and the
  // offset when the pattern does not compile.
  static absl::StatusOr<std::unique_ptr<SplitRegex>> Create(const std::string& onig_pattern);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Hugging Face's Split with behavior "Isolated": every match is a piece and so is
  // every non-empty stretch between matches; `fn` sees them in order. `text` must be
  // valid UTF-8 (it is not checked again).
  absl::Status Split(std::string_view text, absl::FunctionRef<void(std::string_view)> fn) const;

 private:
  explicit SplitRegex(pcre2_real_code_8* code) : code_(code) {}
  pcre2_real_code_8* code_;  // owned
};

}  // namespace moeshard::tokenizer_internal
