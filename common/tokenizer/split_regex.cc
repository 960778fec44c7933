#include "common/tokenizer/split_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace moeshard::tokenizer_internal {
namespace {

std::string Pcre2Message(int error_code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(error_code, buffer, sizeof(buffer));
  if (n < 0) return absl::StrCat("PCRE2 error ", error_code);
  return std::string(reinterpret_cast<const char*>(buffer), static_cast<size_t>(n));
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};

// Length of the UTF-8 character that starts with `lead` (valid input assumed).
size_t CharLen(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// Oniguruma's \s (what Hugging Face's regexes run on) is Unicode White_Space: \t-\r, U+0085
// and the separators Z. PCRE2's UCP \s also takes U+180E (Mongolian vowel separator, a
// format character since Unicode 6.3), so \s and \S are spelled out explicitly.
constexpr char kWhiteSpaceBody[] = R"(\t-\r\x{85}\p{Z})";

std::string WithOnigWhiteSpace(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    const char next = i + 1 < pattern.size() ? pattern[i + 1] : '\0';
    if (c == '\\' && (next == 's' || (next == 'S' && !in_class))) {
      out +=
          in_class ? kWhiteSpaceBody : absl::StrCat(next == 's' ? "[" : "[^", kWhiteSpaceBody, "]");
      ++i;
    } else if (c == '\\' && i + 1 < pattern.size()) {  // any other escape, copied whole
      out.append(pattern.substr(i, 2));
      ++i;
    } else if (in_class && c == '[' && next == ':') {  // a POSIX class such as [:alpha:]
      const size_t close = pattern.find(":]", i + 2);
      const size_t end = close == std::string_view::npos ? pattern.size() : close + 2;
      out.append(pattern.substr(i, end - i));
      i = end - 1;
    } else if (!in_class && c == '[') {  // "]" first in a class is a literal
      in_class = true;
      const size_t literal_start = i + (next == '^' ? 2 : 1);
      const size_t take = literal_start < pattern.size() && pattern[literal_start] == ']'
                              ? literal_start + 1
                              : literal_start;
      out.append(pattern.substr(i, take - i));
      i = take - 1;
    } else {
      if (in_class && c == ']') in_class = false;
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

std::string QuoteRegex(std::string_view literal) {
  std::string out;
  for (const char c : literal) {
    const auto b = static_cast<uint8_t>(c);
    if (b < 0x80 && !absl::ascii_isalnum(c)) {
      if (absl::ascii_isprint(c)) {
        out.push_back('\\');
        out.push_back(c);
      } else {
        absl::StrAppend(&out, "\\x{", absl::Hex(b), "}");
      }
    } else {
      out.push_back(c);
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<SplitRegex>> SplitRegex::Create(const std::string& onig_pattern) {
  const std::string pattern = WithOnigWhiteSpace(onig_pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("pre-tokenizer regex does not compile: ", Pcre2Message(error_code),
                     " at offset ", error_offset, " of '", pattern, "'"));
  }
  // Without JIT support (or when it fails) pcre2_match interprets the pattern instead.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<SplitRegex>(new SplitRegex(code));
}

SplitRegex::~SplitRegex() { pcre2_code_free(code_); }

absl::Status SplitRegex::Split(std::string_view text,
                               absl::FunctionRef<void(std::string_view)> fn) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(
      pcre2_match_data_create_from_pattern(code_, nullptr));
  if (md == nullptr) return absl::ResourceExhaustedError("pcre2_match_data_create failed");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t search_from = 0;  // where the next search starts
  size_t piece_from = 0;   // end of the last emitted piece
  while (search_from < text.size()) {
    int rc = pcre2_match(code_, subject, text.size(), search_from, PCRE2_NO_UTF_CHECK, md.get(),
                         nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code_, subject, text.size(), search_from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       md.get(), nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return absl::ResourceExhaustedError(absl::StrCat("pre-tokenizer regex failed at offset ",
                                                       search_from, ": ", Pcre2Message(rc)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(md.get());
    const size_t start = ovector[0], end = ovector[1];
    if (end == start) {  // empty matches make no piece
      search_from = start + CharLen(static_cast<uint8_t>(text[start < text.size() ? start : 0]));
      continue;
    }
    if (start > piece_from) fn(text.substr(piece_from, start - piece_from));
    fn(text.substr(start, end - start));
    piece_from = search_from = end;
  }
  if (piece_from < text.size()) fn(text.substr(piece_from));
  return absl::OkStatus();
}

}  // namespace moeshard::tokenizer_internal
