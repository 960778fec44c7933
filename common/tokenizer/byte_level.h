// Internal to moeshard_tokenizer: UTF-8 helpers and GPT-2's byte-level alphabet.
//
// GPT-2's bytes_to_unicode() gives every byte a printable code point: the bytes
// '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves, and the other 68 bytes, in
// increasing order, become U+0100, U+0101, ... (so ' ' is 'Ġ' U+0120, '\n' is 'Ċ').
// Vocabularies spell tokens in that alphabet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace moeshard::tokenizer_internal {

// Length of the well-formed UTF-8 sequence at text[pos] (1..4), or 0 when it is not
// well formed (bad lead byte, bad or missing continuation, overlong, surrogate, or
// above U+10FFFF); then *bad_len is the length of the maximal ill-formed subpart
// (at least 1), the unit that gets one U+FFFD. Requires pos < text.size().
size_t Utf8SeqLen(std::string_view text, size_t pos, size_t* bad_len);

// OK for well-formed UTF-8, otherwise InvalidArgument naming the first bad byte offset.
absl::Status ValidateUtf8(std::string_view text);

// Appends `bytes` with each ill-formed subpart replaced by U+FFFD (like Rust's
// String::from_utf8_lossy, which Hugging Face's decoders use).
void AppendUtf8Lossy(std::string_view bytes, std::string* out);

// Decodes the well-formed code point of length `len` starting at text[pos].
char32_t DecodeCodePoint(std::string_view text, size_t pos, size_t len);

// Unicode White_Space (Rust's char::is_whitespace), through ICU.
bool IsUnicodeWhitespace(char32_t cp);

// The byte-level spelling of `bytes`: each byte becomes its code point in UTF-8.
void AppendByteLevel(std::string_view bytes, std::string* out);

// Byte-level spelling back to bytes. False when some character is outside the
// alphabet (then `out` is left unchanged).
bool ByteLevelToBytes(std::string_view token, std::string* out);

}  // namespace moeshard::tokenizer_internal
