#include "common/tokenizer/detokenizer.h"

#include <algorithm>
#include <utility>

#include "common/tokenizer/tokenizer.h"

namespace moeshard {
namespace {

enum class Seq { kOk, kIncomplete, kBad };

// Classifies the UTF-8 sequence starting at s[pos] (Unicode's table of well-formed byte
// sequences). *len: its length when kOk, the bytes present when kIncomplete, the
// maximal ill-formed subpart when kBad.
Seq Scan(std::string_view s, size_t pos, size_t* len) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  *len = 1;
  if (b0 < 0x80) return Seq::kOk;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return Seq::kBad;
  }
  for (size_t i = 1; i < n; ++i) {
    if (pos + i >= s.size()) {
      *len = i;
      return Seq::kIncomplete;
    }
    const auto b = static_cast<unsigned char>(s[pos + i]);
    if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF)) {
      *len = i;
      return Seq::kBad;
    }
  }
  *len = n;
  return Seq::kOk;
}

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

size_t IncompleteUtf8Tail(std::string_view bytes) {
  for (size_t k = 1; k <= 3 && k <= bytes.size(); ++k) {
    size_t len = 0;
    if (Scan(bytes, bytes.size() - k, &len) == Seq::kIncomplete) return k;
  }
  return 0;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t len = 0;
    if (Scan(bytes, pos, &len) == Seq::kOk) {
      out.append(bytes.substr(pos, len));
    } else {
      out.append(kReplacement);
    }
    pos += len;
  }
  return out;
}

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer* tokenizer, Options options)
    : tokenizer_(tokenizer), options_(std::move(options)) {}

std::string IncrementalDetokenizer::Release(size_t num_bytes) {
  std::string out = Utf8Lossy(std::string_view(pending_).substr(0, num_bytes));
  pending_.erase(0, num_bytes);
  return out;
}

std::string IncrementalDetokenizer::Add(int32_t token_id) {
  if (stopped_ || tokenizer_ == nullptr) return "";
  const auto& hidden = options_.hidden_ids;
  const bool shown = std::find(hidden.begin(), hidden.end(), token_id) == hidden.end() &&
                     !(options_.skip_special_tokens && tokenizer_->IsSpecial(token_id));
  if (shown) {
    auto bytes = tokenizer_->TokenBytes(token_id);
    if (bytes.ok()) pending_ += *bytes;  // an id out of range adds nothing
  }
  // The earliest stop string in the buffer ends the text.
  size_t stop_pos = std::string::npos;
  for (const std::string& stop : options_.stop) {
    const size_t p = pending_.find(stop);
    if (p < stop_pos) {
      stop_pos = p;
      matched_stop_ = stop;
    }
  }
  if (stop_pos != std::string::npos) {
    stopped_ = true;
    std::string out = Release(stop_pos);
    pending_.clear();
    return out;
  }
  size_t hold = IncompleteUtf8Tail(pending_);
  for (const std::string& stop : options_.stop) {
    for (size_t k = std::min(stop.size() - 1, pending_.size()); k > hold; --k) {
      if (std::string_view(pending_).substr(pending_.size() - k) == std::string_view(stop).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  return Release(pending_.size() - hold);
}

std::string IncrementalDetokenizer::Flush() {
  if (stopped_) return "";
  return Release(pending_.size());
}

}  // namespace moeshard
