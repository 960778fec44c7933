#include "eval/kld_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "absl/strings/str_cat.h"
#include "eval/kl_stats.h"
#include "common/status.h"

namespace moeshard {
namespace {

constexpr char kMsklMagic[4] = {'M', 'S', 'K', 'L'};
constexpr char kLlamaMagic[8] = {'_', 'l', 'o', 'g', 'i', 't', 's', '_'};
constexpr int64_t kMsklHeaderBytes = 4 + 6 * 4;
constexpr int64_t kLlamaHeaderBytes = 8 + 3 * 4;
constexpr int64_t kMaxDim = int64_t{1} << 24;  // sanity bound on every header field

int64_t MsklWindowBytes(const LogitsLayout& l) { return l.ctx * 4 + l.scored() * l.vocab * 4; }
int64_t LlamaWindowBytes(const LogitsLayout& l) { return l.scored() * LlamaRowUint16s(l.vocab) * 2; }

absl::Status ValidLayout(const LogitsLayout& l, const std::string& what) {
  if (l.vocab < 1 || l.vocab > kMaxDim || l.ctx < 2 || l.ctx > kMaxDim || l.num_windows < 0 ||
      l.num_windows > kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": implausible header (vocab ", l.vocab, ", ctx ", l.ctx, ", windows ", l.num_windows, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckIds(const std::vector<int32_t>& ids, int64_t vocab, const std::string& what) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": token ", i, " is ", ids[i], ", outside the vocabulary of ", vocab));
    }
  }
  return absl::OkStatus();
}

template <typename T>
void Put(std::ofstream& out, T v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof(T));
}

}  // namespace

absl::StatusOr<LogitsFormat> ParseLogitsFormat(const std::string& s) {
  if (s == "mskl") return LogitsFormat::kMskl;
  if (s == "llama") return LogitsFormat::kLlama;
  return absl::InvalidArgumentError(absl::StrCat("unknown logits format '", s, "' (llama, mskl)"));
}

const char* LogitsFormatName(LogitsFormat f) { return f == LogitsFormat::kLlama ? "llama" : "mskl"; }

int64_t LlamaRowUint16s(int64_t vocab) { return 2 * ((vocab + 1) / 2) + 4; }

void QuantizeLlamaRow(const float* logits, int64_t vocab, uint16_t* row) {
  float top = logits[0], low = logits[0];
  for (int64_t i = 1; i < vocab; ++i) {
    top = std::max(top, logits[i]);
    low = std::min(low, logits[i]);
  }
  low = std::max(low, top - 16);
  double sum_exp = 0;
  for (int64_t i = 0; i < vocab; ++i) sum_exp += std::exp(logits[i] - top);
  const float log_sum_exp = static_cast<float>(std::log(sum_exp));
  const float min_log_prob = low - top - log_sum_exp;
  const float scale = (top - low) / 65535.f;
  std::memcpy(row, &scale, 4);
  std::memcpy(row + 2, &min_log_prob, 4);
  uint16_t* q = row + 4;
  std::memset(q, 0, (LlamaRowUint16s(vocab) - 4) * sizeof(uint16_t));
  if (scale == 0) return;
  const float inv_scale = 1 / scale;
  for (int64_t i = 0; i < vocab; ++i) {
    if (logits[i] > low) {
      q[i] = static_cast<uint16_t>(std::clamp<long>(std::lrintf(inv_scale * (logits[i] - low)), 0, 65535));
    }
  }
}

void DequantizeLlamaRow(const uint16_t* row, int64_t vocab, float* logprobs) {
  float scale, min_log_prob;
  std::memcpy(&scale, row, 4);
  std::memcpy(&min_log_prob, row + 2, 4);
  for (int64_t i = 0; i < vocab; ++i) logprobs[i] = scale * row[4 + i] + min_log_prob;
}

absl::StatusOr<std::unique_ptr<LogitsWriter>> LogitsWriter::Create(const std::string& path, LogitsFormat format,
                                                                   const LogitsLayout& layout,
                                                                   const std::vector<int32_t>& ids) {
  RETURN_IF_ERROR(ValidLayout(layout, path));
  if (static_cast<int64_t>(ids.size()) != layout.num_windows * layout.ctx) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", ids.size(), " ids for ", layout.num_windows, " windows of ", layout.ctx));
  }
  std::unique_ptr<LogitsWriter> w(new LogitsWriter());
  w->path_ = path;
  w->format_ = format;
  w->layout_ = layout;
  w->ids_ = ids;
  w->out_.open(path, std::ios::binary | std::ios::trunc);
  if (!w->out_) return absl::PermissionDeniedError(absl::StrCat("cannot write logits file '", path, "'"));
  if (format == LogitsFormat::kMskl) {
    w->out_.write(kMsklMagic, 4);
    for (int64_t v : {int64_t{1}, layout.vocab, layout.ctx, layout.num_windows, layout.first(), layout.scored()}) {
      Put(w->out_, static_cast<uint32_t>(v));
    }
  } else {
    w->out_.write(kLlamaMagic, 8);
    for (int64_t v : {layout.ctx, layout.vocab, layout.num_windows}) Put(w->out_, static_cast<int32_t>(v));
    w->out_.write(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t));
  }
  if (!w->out_) return absl::DataLossError(absl::StrCat("writing the header of '", path, "' failed"));
  return w;
}

absl::Status LogitsWriter::WriteWindow(const float* logits) {
  if (written_ >= layout_.num_windows) {
    return absl::OutOfRangeError(
        absl::StrCat(path_, ": more than the ", layout_.num_windows, " windows of the header"));
  }
  const int64_t V = layout_.vocab, S = layout_.scored();
  if (format_ == LogitsFormat::kMskl) {
    out_.write(reinterpret_cast<const char*>(ids_.data() + written_ * layout_.ctx), layout_.ctx * sizeof(int32_t));
    std::vector<float> lp(V);
    for (int64_t j = 0; j < S; ++j) {
      LogSoftmax(logits + j * V, V, lp.data());
      out_.write(reinterpret_cast<const char*>(lp.data()), V * sizeof(float));
    }
  } else {
    std::vector<uint16_t> row(LlamaRowUint16s(V));
    for (int64_t j = 0; j < S; ++j) {
      QuantizeLlamaRow(logits + j * V, V, row.data());
      out_.write(reinterpret_cast<const char*>(row.data()), row.size() * sizeof(uint16_t));
    }
  }
  if (!out_) return absl::DataLossError(absl::StrCat("writing window ", written_, " of '", path_, "' failed"));
  ++written_;
  return absl::OkStatus();
}

absl::Status LogitsWriter::Close() {
  out_.close();
  if (!out_) return absl::DataLossError(absl::StrCat("closing '", path_, "' failed"));
  if (written_ != layout_.num_windows) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": ", written_, " of ", layout_.num_windows, " windows written"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LogitsReader>> LogitsReader::Open(const std::string& path) {
  std::unique_ptr<LogitsReader> r(new LogitsReader());
  r->path_ = path;
  r->in_.open(path, std::ios::binary);
  if (!r->in_) return absl::NotFoundError(absl::StrCat("cannot open logits file '", path, "'"));
  std::error_code ec;
  const int64_t file_bytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  if (ec) return absl::NotFoundError(absl::StrCat("cannot stat '", path, "': ", ec.message()));
  char magic[8] = {};
  r->in_.read(magic, 8);
  LogitsLayout& l = r->layout_;
  __int128 want_bytes = 0;
  if (r->in_ && std::memcmp(magic, kLlamaMagic, 8) == 0) {
    r->format_ = LogitsFormat::kLlama;
    int32_t f[3];
    r->in_.read(reinterpret_cast<char*>(f), sizeof(f));
    if (!r->in_) return absl::InvalidArgumentError(absl::StrCat("'", path, "': truncated llama.cpp header"));
    l = {f[1], f[0], f[2]};
    RETURN_IF_ERROR(ValidLayout(l, path));
    r->data_offset_ = kLlamaHeaderBytes + l.num_windows * l.ctx * 4;
    want_bytes = r->data_offset_ + static_cast<__int128>(l.num_windows) * LlamaWindowBytes(l);
  } else if (r->in_ && std::memcmp(magic, kMsklMagic, 4) == 0) {
    r->format_ = LogitsFormat::kMskl;
    uint32_t f[6];
    std::memcpy(f, magic + 4, 4);
    r->in_.read(reinterpret_cast<char*>(f + 1), 20);
    if (!r->in_) return absl::InvalidArgumentError(absl::StrCat("'", path, "': truncated MSKL header"));
    if (f[0] != 1) return absl::InvalidArgumentError(absl::StrCat("'", path, "': unsupported MSKL version ", f[0]));
    l = {f[1], f[2], f[3]};
    RETURN_IF_ERROR(ValidLayout(l, path));
    if (f[4] != l.first() || f[5] != l.scored()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "' scores positions ", f[4], "+", f[5], ", not ctx/2 .. ctx-2"));
    }
    want_bytes = kMsklHeaderBytes + static_cast<__int128>(l.num_windows) * MsklWindowBytes(l);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is neither an MSKL nor a llama.cpp logits file"));
  }
  if (want_bytes != file_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' holds ", file_bytes, " bytes; its header (", LogitsFormatName(r->format_), ", vocab ", l.vocab,
        ", ctx ", l.ctx, ", ", l.num_windows, " windows) needs ", static_cast<int64_t>(want_bytes)));
  }
  r->ids_.resize(l.num_windows * l.ctx);
  if (r->format_ == LogitsFormat::kLlama) {
    r->in_.read(reinterpret_cast<char*>(r->ids_.data()), r->ids_.size() * sizeof(int32_t));
  } else {
    for (int64_t w = 0; w < l.num_windows; ++w) {
      r->in_.seekg(kMsklHeaderBytes + w * MsklWindowBytes(l));
      r->in_.read(reinterpret_cast<char*>(r->ids_.data() + w * l.ctx), l.ctx * sizeof(int32_t));
    }
  }
  if (!r->in_) return absl::DataLossError(absl::StrCat("reading the token ids of '", path, "' failed"));
  RETURN_IF_ERROR(CheckIds(r->ids_, l.vocab, path));
  return r;
}

absl::Status LogitsReader::ReadWindow(int64_t w, std::vector<float>* logprobs) {
  const LogitsLayout& l = layout_;
  if (w < 0 || w >= l.num_windows) return absl::OutOfRangeError(absl::StrCat(path_, ": no window ", w));
  const int64_t S = l.scored(), V = l.vocab;
  logprobs->resize(S * V);
  if (format_ == LogitsFormat::kMskl) {
    in_.seekg(kMsklHeaderBytes + w * MsklWindowBytes(l) + l.ctx * 4);
    in_.read(reinterpret_cast<char*>(logprobs->data()), S * V * sizeof(float));
  } else {
    const int64_t nv = LlamaRowUint16s(V);
    row_.resize(S * nv);
    in_.seekg(data_offset_ + w * LlamaWindowBytes(l));
    in_.read(reinterpret_cast<char*>(row_.data()), row_.size() * sizeof(uint16_t));
    for (int64_t j = 0; j < S; ++j) DequantizeLlamaRow(row_.data() + j * nv, V, logprobs->data() + j * V);
  }
  if (!in_) return absl::DataLossError(absl::StrCat("reading window ", w, " of '", path_, "' failed"));
  return absl::OkStatus();
}

float LogitsReader::kl_floor() const {
  return format_ == LogitsFormat::kLlama ? -16.f : -std::numeric_limits<float>::infinity();
}

}  // namespace moeshard
