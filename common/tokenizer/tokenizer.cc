// Byte-level BPE as Hugging Face's `tokenizers` runs it:
//   1. Added tokens are cut out of the raw text first (leftmost, then longest match),
//      with lstrip/rstrip eating the whitespace beside them; they are never normalized.
//   2. Each remaining segment is NFC-normalized (when asked), split by the pre-tokenizer
//      regex into pieces, and each piece's bytes are spelled in GPT-2's byte alphabet.
//   3. BPE per piece: start from one symbol per byte and repeatedly apply the pair with
//      the lowest merge rank (leftmost first among equal ranks), through a min-heap of
//      candidate pairs with stale entries skipped, exactly as tokenizers' Word::merge_all.
// Decoding concatenates each token's bytes (precomputed) and repairs broken UTF-8 with
// U+FFFD like from_utf8_lossy.
#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/split_regex.h"
#include "unicode/bytestream.h"
#include "unicode/normalizer2.h"

namespace moeshard {
namespace ti = tokenizer_internal;
namespace {

constexpr int32_t kMaxVocabSize = 1 << 24;

enum class Kind : uint8_t { kUnused, kNormal, kAdded };

struct MergeInfo {
  int32_t rank;
  int32_t new_id;
};

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

bool IsAscii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<uint8_t>(c) < 0x80; });
}

}  // namespace

struct Tokenizer::Impl {
  std::vector<std::string> token_bytes;  // what Decode emits for each id
  std::vector<Kind> kinds;
  std::vector<bool> special;
  absl::flat_hash_map<std::string, int32_t> vocab_ids;  // byte-level spelling -> id
  absl::flat_hash_map<uint64_t, MergeInfo> merges;      // (left id, right id) -> merge
  std::array<int32_t, 256> byte_ids{};
  std::vector<AddedToken> added;
  std::array<std::vector<int32_t>, 256> added_by_first_byte;  // indices, longest first
  absl::flat_hash_map<std::string, int32_t> added_ids;
  std::unique_ptr<ti::SplitRegex> split;
  const icu::Normalizer2* nfc = nullptr;  // ICU's singleton; null = no normalization
  bool add_prefix_space = false;
  bool ignore_merges = false;
  std::optional<int32_t> bos_id, eos_id;

  // `special_ok` null: every added token counts; otherwise special ones only inside its ranges.
  bool FindAdded(std::string_view text, size_t from, size_t* start, int32_t* added_idx, const Ranges* special_ok) const;
  absl::Status EncodeSegment(std::string_view segment, std::vector<int32_t>* ids) const;
  void Bpe(std::string_view piece, std::vector<int32_t>* ids) const;
  absl::Status CheckId(int32_t id) const;
};

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(TokenizerSpec spec) {
  if (spec.vocab.size() > static_cast<size_t>(kMaxVocabSize)) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab of ", spec.vocab.size(), " tokens is too large"));
  }
  int32_t num_ids = static_cast<int32_t>(spec.vocab.size());
  for (const AddedToken& t : spec.added) {
    if (t.id < 0 || t.id >= kMaxVocabSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("added token '", t.content, "' has bad id ", t.id));
    }
    num_ids = std::max(num_ids, t.id + 1);
  }
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  Impl& m = *tok->impl_;
  m.token_bytes.resize(num_ids);
  m.kinds.assign(num_ids, Kind::kUnused);
  m.special.assign(num_ids, false);
  m.vocab_ids.reserve(spec.vocab.size());
  for (int32_t id = 0; id < static_cast<int32_t>(spec.vocab.size()); ++id) {
    const std::string& s = spec.vocab[id];
    if (s.empty()) continue;  // a hole in the id space
    m.kinds[id] = Kind::kNormal;
    if (!ti::ByteLevelToBytes(s, &m.token_bytes[id])) m.token_bytes[id] = s;
    m.vocab_ids.emplace(s, id);  // the first id wins for a repeated string
  }

  for (AddedToken& t : spec.added) {
    if (t.content.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("added token ", t.id, " is empty"));
    }
    if (!ti::ValidateUtf8(t.content).ok()) {
      return absl::InvalidArgumentError(absl::StrCat("added token ", t.id, " is not valid UTF-8"));
    }
    if (m.kinds[t.id] == Kind::kAdded) {
      return absl::InvalidArgumentError(absl::StrCat("added token id ", t.id, " is listed twice"));
    }
    m.kinds[t.id] = Kind::kAdded;
    m.special[t.id] = t.special;
    m.token_bytes[t.id] = t.content;
    if (m.added_ids.emplace(t.content, t.id).second) m.added.push_back(std::move(t));
  }
  std::stable_sort(m.added.begin(), m.added.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.content.size() > b.content.size();
  });
  for (int32_t i = 0; i < static_cast<int32_t>(m.added.size()); ++i) {
    m.added_by_first_byte[static_cast<uint8_t>(m.added[i].content[0])].push_back(i);
  }

  for (int b = 0; b < 256; ++b) {
    std::string spelled;
    const char byte = static_cast<char>(b);
    ti::AppendByteLevel(std::string_view(&byte, 1), &spelled);
    auto it = m.vocab_ids.find(spelled);
    if (it == m.vocab_ids.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "vocab has no token for byte 0x", absl::Hex(b, absl::kZeroPad2), " ('", spelled, "')"));
    }
    m.byte_ids[b] = it->second;
  }

  m.merges.reserve(spec.merges.size());
  std::string joined;
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [left, right] = spec.merges[rank];
    joined.assign(left).append(right);
    int32_t ids[3];
    const std::string* parts[3] = {&left, &right, &joined};
    for (int i = 0; i < 3; ++i) {
      auto it = m.vocab_ids.find(*parts[i]);
      if (it == m.vocab_ids.end()) {
        return absl::InvalidArgumentError(absl::StrCat("merge ", rank, " ('", left, " ", right,
                                                       "') refers to unknown token '", *parts[i],
                                                       "'"));
      }
      ids[i] = it->second;
    }
    // A pair listed twice keeps its last rank, like tokenizers' map construction.
    m.merges.insert_or_assign(PairKey(ids[0], ids[1]),
                              MergeInfo{static_cast<int32_t>(rank), ids[2]});
  }

  const std::string pattern = spec.split_regex.empty() ? ti::kQwen2Pattern : spec.split_regex;
  ASSIGN_OR_RETURN(m.split, ti::SplitRegex::Create(pattern));
  if (spec.nfc) {
    UErrorCode status = U_ZERO_ERROR;
    m.nfc = icu::Normalizer2::getNFCInstance(status);
    if (U_FAILURE(status) || m.nfc == nullptr) {
      return absl::InternalError(
          absl::StrCat("ICU NFC normalizer unavailable: ", u_errorName(status)));
    }
  }
  m.add_prefix_space = spec.add_prefix_space;
  m.ignore_merges = spec.ignore_merges;
  const std::pair<const char*, std::optional<int32_t>> named_ids[] = {
      {"bos", spec.bos_id}, {"eos", spec.eos_id}, {"pad", spec.pad_id}};
  for (const auto& [name, id] : named_ids) {
    if (id.has_value() && (*id < 0 || *id >= num_ids || m.kinds[*id] == Kind::kUnused)) {
      return absl::InvalidArgumentError(absl::StrCat(name, " id ", *id, " is not a token"));
    }
  }
  m.bos_id = spec.bos_id;
  m.eos_id = spec.eos_id;
  return tok;
}

namespace {

bool InsideOne(const Tokenizer::Ranges& ranges, size_t begin, size_t end) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), std::make_pair(begin, std::numeric_limits<size_t>::max()));
  return it != ranges.begin() && std::prev(it)->first <= begin && end <= std::prev(it)->second;
}

}  // namespace

bool Tokenizer::Impl::FindAdded(std::string_view text, size_t from, size_t* start, int32_t* added_idx,
                                const Ranges* special_ok) const {
  if (added.empty()) return false;
  for (size_t pos = from; pos < text.size(); ++pos) {
    for (const int32_t idx : added_by_first_byte[static_cast<uint8_t>(text[pos])]) {
      const std::string& content = added[idx].content;
      if (special_ok != nullptr && added[idx].special && !InsideOne(*special_ok, pos, pos + content.size())) continue;
      if (text.compare(pos, content.size(), content) == 0) {
        *start = pos;
        *added_idx = idx;
        return true;
      }
    }
  }
  return false;
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(const std::string& text) const {
  return EncodeImpl(text, nullptr);
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::EncodeWithSpecialIn(const std::string& text, const Ranges& special_ok) const {
  return EncodeImpl(text, &special_ok);
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::EncodeImpl(const std::string& text, const Ranges* special_ok) const {
  RETURN_IF_ERROR(ti::ValidateUtf8(text));
  const std::string_view view(text);
  std::vector<int32_t> ids;
  size_t segment_start = 0;
  size_t match_start = 0;
  int32_t idx = 0;
  while (impl_->FindAdded(view, segment_start, &match_start, &idx, special_ok)) {
    const AddedToken& token = impl_->added[idx];
    size_t segment_end = match_start;
    size_t next = match_start + token.content.size();
    if (token.lstrip) {
      while (segment_end > segment_start) {
        size_t char_start = segment_end - 1;
        while (char_start > segment_start &&
               (static_cast<uint8_t>(view[char_start]) & 0xC0) == 0x80)
          --char_start;
        size_t bad_len = 0;
        const size_t len = ti::Utf8SeqLen(view, char_start, &bad_len);
        if (!ti::IsUnicodeWhitespace(ti::DecodeCodePoint(view, char_start, len))) break;
        segment_end = char_start;
      }
    }
    if (token.rstrip) {
      while (next < view.size()) {
        size_t bad_len = 0;
        const size_t len = ti::Utf8SeqLen(view, next, &bad_len);
        if (!ti::IsUnicodeWhitespace(ti::DecodeCodePoint(view, next, len))) break;
        next += len;
      }
    }
    RETURN_IF_ERROR(
        impl_->EncodeSegment(view.substr(segment_start, segment_end - segment_start), &ids));
    ids.push_back(token.id);
    segment_start = next;
  }
  RETURN_IF_ERROR(impl_->EncodeSegment(view.substr(segment_start), &ids));
  return ids;
}

absl::Status Tokenizer::Impl::EncodeSegment(std::string_view segment,
                                            std::vector<int32_t>* ids) const {
  if (segment.empty()) return absl::OkStatus();
  std::string normalized, prefixed;
  if (nfc != nullptr && !IsAscii(segment)) {
    UErrorCode status = U_ZERO_ERROR;
    const icu::StringPiece piece(segment.data(), static_cast<int32_t>(segment.size()));
    if (!nfc->isNormalizedUTF8(piece, status) || U_FAILURE(status)) {
      status = U_ZERO_ERROR;
      icu::StringByteSink<std::string> sink(&normalized);
      nfc->normalizeUTF8(0, piece, sink, nullptr, status);
      if (U_FAILURE(status)) {
        return absl::InternalError(absl::StrCat("NFC normalization failed: ", u_errorName(status)));
      }
      segment = normalized;
    }
  }
  if (add_prefix_space && segment.front() != ' ') {
    prefixed.reserve(segment.size() + 1);
    prefixed.append(" ").append(segment);
    segment = prefixed;
  }
  return split->Split(segment, [&](std::string_view piece) { Bpe(piece, ids); });
}

void Tokenizer::Impl::Bpe(std::string_view piece, std::vector<int32_t>* ids) const {
  if (piece.size() == 1) {
    ids->push_back(byte_ids[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (ignore_merges) {
    std::string spelled;
    ti::AppendByteLevel(piece, &spelled);
    if (auto it = vocab_ids.find(spelled); it != vocab_ids.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  struct Symbol {
    int32_t id, prev, next;
    bool alive;
  };
  struct Candidate {
    int32_t rank, pos, new_id;
  };
  const int32_t n = static_cast<int32_t>(piece.size());
  absl::InlinedVector<Symbol, 64> symbols(n);
  absl::InlinedVector<Candidate, 64> heap;
  // std heap functions build a max-heap; "greater" puts the lowest (rank, pos) on top.
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  const auto push_pair = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges.find(PairKey(symbols[pos].id, symbols[next].id));
    if (it == merges.end()) return;
    heap.push_back({it->second.rank, pos, it->second.new_id});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {byte_ids[static_cast<uint8_t>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1, true};
  }
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& sym = symbols[top.pos];
    if (!sym.alive || sym.next < 0) continue;
    const int32_t right = sym.next;
    auto it = merges.find(PairKey(sym.id, symbols[right].id));
    if (it == merges.end() || it->second.new_id != top.new_id) continue;  // stale entry
    sym.id = top.new_id;
    sym.next = symbols[right].next;
    symbols[right].alive = false;
    if (sym.next >= 0) symbols[sym.next].prev = top.pos;
    if (sym.prev >= 0) push_pair(sym.prev);
    push_pair(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

absl::Status Tokenizer::Impl::CheckId(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(kinds.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", id, " is out of range [0, ", kinds.size(), ")"));
  }
  if (kinds[id] == Kind::kUnused) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", id, " is not assigned to any token"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  for (const int32_t id : ids) {
    RETURN_IF_ERROR(impl_->CheckId(id));
    bytes += impl_->token_bytes[id];
  }
  std::string text;
  text.reserve(bytes.size());
  ti::AppendUtf8Lossy(bytes, &text);
  return text;
}

absl::StatusOr<std::string> Tokenizer::TokenBytes(int32_t id) const {
  RETURN_IF_ERROR(impl_->CheckId(id));
  return impl_->token_bytes[id];
}

std::optional<int32_t> Tokenizer::TokenId(const std::string& token_content) const {
  if (auto it = impl_->added_ids.find(token_content); it != impl_->added_ids.end()) {
    return it->second;
  }
  if (auto it = impl_->vocab_ids.find(token_content); it != impl_->vocab_ids.end()) {
    return it->second;
  }
  return std::nullopt;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->kinds.size()); }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos_id; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos_id; }
bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[id];
}

}  // namespace moeshard
