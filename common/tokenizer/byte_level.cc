#include "common/tokenizer/byte_level.h"

#include <array>

#include "absl/strings/str_cat.h"
#include "unicode/uchar.h"

namespace moeshard::tokenizer_internal {
namespace {

// Code points of the byte-level alphabet are all below this.
constexpr int kAlphabetLimit = 0x144;

struct ByteTables {
  std::array<std::array<char, 2>, 256> spelling{};  // UTF-8 of each byte's code point
  std::array<uint8_t, 256> spelling_len{};
  std::array<int16_t, kAlphabetLimit> byte_of{};  // code point -> byte, -1 if none

  ByteTables() {
    byte_of.fill(-1);
    int next_extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const int cp = printable ? b : 256 + next_extra++;
      byte_of[cp] = static_cast<int16_t>(b);
      if (cp < 0x80) {
        spelling[b][0] = static_cast<char>(cp);
        spelling_len[b] = 1;
      } else {
        spelling[b][0] = static_cast<char>(0xC0 | (cp >> 6));
        spelling[b][1] = static_cast<char>(0x80 | (cp & 0x3F));
        spelling_len[b] = 2;
      }
    }
  }
};

const ByteTables& Tables() {
  static const ByteTables* const tables = new ByteTables();
  return *tables;
}

}  // namespace

size_t Utf8SeqLen(std::string_view text, size_t pos, size_t* bad_len) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  const uint8_t b0 = p[pos];
  if (b0 < 0x80) return 1;
  size_t num_cont = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    num_cont = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    num_cont = 2;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    num_cont = 3;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    *bad_len = 1;
    return 0;
  }
  size_t i = 1;
  for (; i <= num_cont && pos + i < n; ++i) {
    const uint8_t b = p[pos + i];
    if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF)) break;
  }
  if (i > num_cont) return num_cont + 1;
  *bad_len = i;
  return 0;
}

absl::Status ValidateUtf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t bad_len = 0;
    const size_t len = Utf8SeqLen(text, pos, &bad_len);
    if (len == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("text is not valid UTF-8: bad byte 0x",
                       absl::Hex(static_cast<uint8_t>(text[pos + bad_len - 1]), absl::kZeroPad2),
                       " at offset ", pos + bad_len - 1));
    }
    pos += len;
  }
  return absl::OkStatus();
}

void AppendUtf8Lossy(std::string_view bytes, std::string* out) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t bad_len = 0;
    const size_t len = Utf8SeqLen(bytes, pos, &bad_len);
    if (len > 0) {
      out->append(bytes.data() + pos, len);
      pos += len;
    } else {
      out->append("\xEF\xBF\xBD");
      pos += bad_len;
    }
  }
}

char32_t DecodeCodePoint(std::string_view text, size_t pos, size_t len) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data()) + pos;
  switch (len) {
    case 1:
      return p[0];
    case 2:
      return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    case 3:
      return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    default:
      return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) |
             (p[3] & 0x3Fu);
  }
}

bool IsUnicodeWhitespace(char32_t cp) { return u_isUWhiteSpace(static_cast<UChar32>(cp)); }

void AppendByteLevel(std::string_view bytes, std::string* out) {
  const ByteTables& t = Tables();
  for (const char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    out->append(t.spelling[b].data(), t.spelling_len[b]);
  }
}

bool ByteLevelToBytes(std::string_view token, std::string* out) {
  const ByteTables& t = Tables();
  std::string bytes;
  bytes.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    size_t bad_len = 0;
    const size_t len = Utf8SeqLen(token, pos, &bad_len);
    if (len == 0 || len > 2) return false;
    const char32_t cp = DecodeCodePoint(token, pos, len);
    if (cp >= kAlphabetLimit || t.byte_of[cp] < 0) return false;
    bytes.push_back(static_cast<char>(t.byte_of[cp]));
    pos += len;
  }
  out->append(bytes);
  return true;
}

}  // namespace moeshard::tokenizer_internal
