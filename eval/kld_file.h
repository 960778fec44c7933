// Files of per-position log-probabilities written by `moeshard eval --save-logits` and read
// by `--compare`, in two layouts. Both hold the same windows (llama.cpp calls them chunks):
// window w is ids[w*ctx .. (w+1)*ctx), run from position 0, and the rows of positions
// first = ctx/2 .. ctx-2 are kept, row j predicting ids[w*ctx + first + j + 1]
// (scored = ctx-1-first rows a window). All numbers little endian.
//
// kMskl, moeshard's own layout, exact float32 log-probabilities:
//   char[4] "MSKL", uint32 version (1), uint32 vocab, uint32 ctx, uint32 num_windows,
//   uint32 first, uint32 scored; then per window int32 ids[ctx], float32 logprobs[scored][vocab].
//
// kLlama, the file of llama.cpp's `llama-perplexity --kl-divergence-base` (tools/perplexity):
//   char[8] "_logits_", int32 ctx, int32 vocab, int32 num_windows,
//   int32 ids[num_windows * ctx] (all windows' tokens up front);
//   then per window `scored` rows of LlamaRowUint16s(vocab) = 2*((vocab+1)/2) + 4 uint16 each:
//   float32 scale, float32 min_log_prob, uint16 q[vocab], one uint16 of padding when vocab is odd.
//   A row stores log p_i = scale * q_i + min_log_prob. With M, m the row's largest and smallest
//   logit, m raised to M - 16 when lower: scale = (M - m) / 65535, min_log_prob = m - logsumexp,
//   q_i = round((logit_i - m) / scale) for logits above m, else 0 (so every log-probability more
//   than 16 below the top one reads back as min_log_prob). Above m the error of a stored value
//   is at most scale / 2 <= 1.23e-4 plus float rounding.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace moeshard {

enum class LogitsFormat { kMskl, kLlama };
absl::StatusOr<LogitsFormat> ParseLogitsFormat(const std::string& s);  // "mskl" | "llama"
const char* LogitsFormatName(LogitsFormat f);

struct LogitsLayout {
  int64_t vocab = 0, ctx = 0, num_windows = 0;
  int64_t first() const { return ctx / 2; }
  int64_t scored() const { return ctx - 1 - ctx / 2; }
};

// One llama.cpp row (see above): `logits` [vocab] raw logits (any shift) -> `row`
// [LlamaRowUint16s(vocab)], computed in float as llama-perplexity does; and back to
// log-probabilities.
int64_t LlamaRowUint16s(int64_t vocab);
void QuantizeLlamaRow(const float* logits, int64_t vocab, uint16_t* row);
void DequantizeLlamaRow(const uint16_t* row, int64_t vocab, float* logprobs);

// Writes windows in order. Not thread-safe.
class LogitsWriter {
 public:
  // `ids` holds the tokens of every window, [layout.num_windows * layout.ctx].
  static absl::StatusOr<std::unique_ptr<LogitsWriter>> Create(const std::string& path, LogitsFormat format,
                                                              const LogitsLayout& layout,
                                                              const std::vector<int32_t>& ids);
  // The next window's raw logits of its scored positions, [scored][vocab].
  absl::Status WriteWindow(const float* logits);
  // Fails unless every window was written.
  absl::Status Close();

 private:
  LogitsWriter() = default;
  std::string path_;
  LogitsFormat format_ = LogitsFormat::kMskl;
  LogitsLayout layout_;
  std::vector<int32_t> ids_;
  int64_t written_ = 0;
  std::ofstream out_;
};

// Reads a file of either layout (told apart by the magic). The size of the file is checked
// against its header on Open, so a truncated file is an error before any window is read.
// Not thread-safe.
class LogitsReader {
 public:
  static absl::StatusOr<std::unique_ptr<LogitsReader>> Open(const std::string& path);
  LogitsFormat format() const { return format_; }
  const LogitsLayout& layout() const { return layout_; }
  const std::vector<int32_t>& ids() const { return ids_; }  // [num_windows * ctx]
  // Log-probabilities of window `w`'s scored positions, [scored][vocab].
  absl::Status ReadWindow(int64_t w, std::vector<float>* logprobs);
  // Base log-probabilities at or below this are left out of KL, as llama-perplexity does
  // with its own files (-16); -infinity for MSKL files.
  float kl_floor() const;

 private:
  LogitsReader() = default;
  std::string path_;
  LogitsFormat format_ = LogitsFormat::kMskl;
  LogitsLayout layout_;
  std::vector<int32_t> ids_;
  int64_t data_offset_ = 0;  // llama: where window 0's rows start
  std::ifstream in_;
  std::vector<uint16_t> row_;
};

}  // namespace moeshard
