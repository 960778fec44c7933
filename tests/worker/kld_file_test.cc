// The logits files of `moeshard eval` (eval/kld_file.h): a llama.cpp --kl-divergence-base
// file built here byte by byte from the documented layout must read back as built; both
// layouts round-trip through our writer with the right header fields and, for llama.cpp's
// uint16 rows, within the quantization bound; and KlStats on hand-computed distributions.
#include "eval/kld_file.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "eval/kl_stats.h"
#include "gtest/gtest.h"

namespace moeshard {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "." + std::to_string(getpid()))).string();
}

// Little-endian appenders for building files by hand.
void PutBytes(std::string* s, const void* p, size_t n) { s->append(static_cast<const char*>(p), n); }
void PutI32(std::string* s, int32_t v) { PutBytes(s, &v, 4); }
void PutF32(std::string* s, float v) { PutBytes(s, &v, 4); }
void PutU16(std::string* s, uint16_t v) { PutBytes(s, &v, 2); }

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// ctx 4 (first 2, one scored row per chunk), vocab 3 (odd: one uint16 of padding a row), 2 chunks.
std::string TinyLlamaFile() {
  std::string s = "_logits_";
  PutI32(&s, 4);  // n_ctx
  PutI32(&s, 3);  // n_vocab
  PutI32(&s, 2);  // n_chunk
  for (int32_t id : {0, 1, 2, 1, 2, 2, 0, 1}) PutI32(&s, id);
  // chunk 0: log p = 0.25 * {0, 8, 16} - 4 = {-4, -2, 0}
  PutF32(&s, 0.25f);
  PutF32(&s, -4.f);
  for (uint16_t q : {0, 8, 16, 0xffff /* padding */}) PutU16(&s, q);
  // chunk 1: log p = 0.5 * {20, 0, 4} - 10 = {0, -10, -8}
  PutF32(&s, 0.5f);
  PutF32(&s, -10.f);
  for (uint16_t q : {20, 0, 4, 0}) PutU16(&s, q);
  return s;
}

TEST(KldFileTest, ReadsHandBuiltLlamaFile) {
  const std::string path = TempPath("tiny.kld");
  WriteFile(path, TinyLlamaFile());
  auto r = LogitsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->format(), LogitsFormat::kLlama);
  EXPECT_EQ((*r)->layout().ctx, 4);
  EXPECT_EQ((*r)->layout().vocab, 3);
  EXPECT_EQ((*r)->layout().num_windows, 2);
  EXPECT_EQ((*r)->layout().first(), 2);
  EXPECT_EQ((*r)->layout().scored(), 1);
  EXPECT_EQ((*r)->ids(), (std::vector<int32_t>{0, 1, 2, 1, 2, 2, 0, 1}));
  EXPECT_EQ((*r)->kl_floor(), -16.f);
  std::vector<float> lp;
  ASSERT_TRUE((*r)->ReadWindow(1, &lp).ok());  // out of order on purpose
  EXPECT_EQ(lp, (std::vector<float>{0, -10, -8}));
  ASSERT_TRUE((*r)->ReadWindow(0, &lp).ok());
  EXPECT_EQ(lp, (std::vector<float>{-4, -2, 0}));
  EXPECT_FALSE((*r)->ReadWindow(2, &lp).ok());
  std::filesystem::remove(path);
}

TEST(KldFileTest, RejectsDamagedFiles) {
  const std::string path = TempPath("bad.kld");
  const std::string good = TinyLlamaFile();
  WriteFile(path, good.substr(0, good.size() - 1));
  EXPECT_FALSE(LogitsReader::Open(path).ok()) << "truncated";
  WriteFile(path, good + "x");
  EXPECT_FALSE(LogitsReader::Open(path).ok()) << "trailing bytes";
  std::string bad = good;
  bad[0] = 'X';
  WriteFile(path, bad);
  EXPECT_FALSE(LogitsReader::Open(path).ok()) << "magic";
  bad = good;
  const int32_t id = 3;  // == vocab
  std::memcpy(&bad[20], &id, 4);
  WriteFile(path, bad);
  EXPECT_FALSE(LogitsReader::Open(path).ok()) << "token id outside the vocabulary";
  EXPECT_FALSE(LogitsReader::Open(path + ".missing").ok());
  std::filesystem::remove(path);
}

// Windows of random logits, one row spanning more than 16 (clamped below) and one constant.
std::vector<float> TestLogits(const LogitsLayout& l) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 3.f);
  std::vector<float> x(l.num_windows * l.scored() * l.vocab);
  for (auto& v : x) v = dist(rng);
  for (int64_t i = 0; i < l.vocab; ++i) x[i] = 5.f - 30.f * i / l.vocab;  // row 0: range 30
  std::fill(x.begin() + l.vocab, x.begin() + 2 * l.vocab, 1.5f);          // row 1: constant
  return x;
}

TEST(KldFileTest, LlamaRoundTripWithinQuantizationBound) {
  const LogitsLayout l{37, 8, 3};  // odd vocab; 3 scored rows a window
  std::vector<int32_t> ids(l.num_windows * l.ctx);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = (i * 5) % l.vocab;
  const std::vector<float> logits = TestLogits(l);
  const std::string path = TempPath("rt.kld");
  auto w = LogitsWriter::Create(path, LogitsFormat::kLlama, l, ids);
  ASSERT_TRUE(w.ok()) << w.status();
  for (int64_t k = 0; k < l.num_windows; ++k)
    ASSERT_TRUE((*w)->WriteWindow(logits.data() + k * l.scored() * l.vocab).ok());
  EXPECT_FALSE((*w)->WriteWindow(logits.data()).ok()) << "one window too many";
  ASSERT_TRUE((*w)->Close().ok());

  // The header, read back as raw bytes.
  const std::string bytes = ReadFile(path);
  const int64_t nv = 2 * ((l.vocab + 1) / 2) + 4;
  ASSERT_EQ(static_cast<int64_t>(bytes.size()), 20 + l.num_windows * l.ctx * 4 + l.num_windows * l.scored() * nv * 2);
  EXPECT_EQ(bytes.substr(0, 8), "_logits_");
  int32_t f[3];
  std::memcpy(f, bytes.data() + 8, 12);
  EXPECT_EQ(f[0], l.ctx);
  EXPECT_EQ(f[1], l.vocab);
  EXPECT_EQ(f[2], l.num_windows);
  EXPECT_EQ(std::memcmp(bytes.data() + 20, ids.data(), ids.size() * 4), 0);

  auto r = LogitsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->format(), LogitsFormat::kLlama);
  EXPECT_EQ((*r)->ids(), ids);
  std::vector<float> lp;
  for (int64_t k = 0; k < l.num_windows; ++k) {
    ASSERT_TRUE((*r)->ReadWindow(k, &lp).ok());
    for (int64_t j = 0; j < l.scored(); ++j) {
      const float* x = logits.data() + (k * l.scored() + j) * l.vocab;
      float top = x[0], low = x[0];
      for (int64_t i = 0; i < l.vocab; ++i) top = std::max(top, x[i]), low = std::min(low, x[i]);
      low = std::max(low, top - 16);
      double lse = 0;
      for (int64_t i = 0; i < l.vocab; ++i) lse += std::exp(static_cast<double>(x[i]) - top);
      lse = top + std::log(lse);
      const double bound = (top - low) / 65535.0 / 2 + 1e-5;
      for (int64_t i = 0; i < l.vocab; ++i) {
        const double exact = x[i] - lse, got = lp[j * l.vocab + i];
        if (x[i] > low) {
          EXPECT_NEAR(got, exact, bound) << "window " << k << " row " << j << " id " << i;
        } else {  // more than 16 below the top: stored as the row's minimum
          EXPECT_NEAR(got, low - lse, 1e-5);
          EXPECT_GE(got, exact - 1e-5);
        }
      }
    }
  }
  std::filesystem::remove(path);
}

TEST(KldFileTest, MsklRoundTripIsExact) {
  const LogitsLayout l{37, 8, 3};
  std::vector<int32_t> ids(l.num_windows * l.ctx, 4);
  const std::vector<float> logits = TestLogits(l);
  const std::string path = TempPath("rt.mskl");
  auto w = LogitsWriter::Create(path, LogitsFormat::kMskl, l, ids);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->WriteWindow(logits.data()).ok());
  EXPECT_FALSE((*w)->Close().ok()) << "two windows missing";
  w = LogitsWriter::Create(path, LogitsFormat::kMskl, l, ids);
  ASSERT_TRUE(w.ok());
  for (int64_t k = 0; k < l.num_windows; ++k)
    ASSERT_TRUE((*w)->WriteWindow(logits.data() + k * l.scored() * l.vocab).ok());
  ASSERT_TRUE((*w)->Close().ok());
  auto r = LogitsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->format(), LogitsFormat::kMskl);
  EXPECT_EQ((*r)->layout().vocab, l.vocab);
  EXPECT_EQ((*r)->layout().ctx, l.ctx);
  EXPECT_EQ((*r)->layout().num_windows, l.num_windows);
  EXPECT_EQ((*r)->ids(), ids);
  EXPECT_TRUE(std::isinf((*r)->kl_floor()));
  std::vector<float> lp, want(l.vocab);
  ASSERT_TRUE((*r)->ReadWindow(2, &lp).ok());
  for (int64_t j = 0; j < l.scored(); ++j) {
    LogSoftmax(logits.data() + (2 * l.scored() + j) * l.vocab, l.vocab, want.data());
    EXPECT_EQ(std::vector<float>(lp.begin() + j * l.vocab, lp.begin() + (j + 1) * l.vocab), want);
  }
  std::filesystem::remove(path);
}

TEST(KlStatsTest, HandComputed) {
  const float base[3] = {std::log(0.5f), std::log(0.25f), std::log(0.25f)};
  const float run[3] = {std::log(0.25f), std::log(0.5f), std::log(0.25f)};
  KlStats s;
  s.Add(base, base, 3, 0, -INFINITY);
  s.Add(base, run, 3, 0, -INFINITY);  // KL = 0.5 ln 2 + 0.25 ln 0.5 = 0.25 ln 2
  EXPECT_EQ(s.count(), 2);
  EXPECT_NEAR(s.max_kl(), 0.25 * std::log(2.0), 1e-6);
  EXPECT_NEAR(s.mean_kl(), 0.125 * std::log(2.0), 1e-6);
  EXPECT_DOUBLE_EQ(s.top1(), 0.5);
  EXPECT_NEAR(s.base_ppl(), 2.0, 1e-5);              // p(next) = 0.5 twice
  EXPECT_NEAR(s.ppl(), std::sqrt(2.0 * 4.0), 1e-5);  // 0.5 then 0.25
  EXPECT_NE(s.Format().find("top-1 agreement 50.00 %"), std::string::npos) << s.Format();
  KlStats raw;  // the same from logits shifted by +3 and -1, in double
  const float base_logits[3] = {base[0] + 3, base[1] + 3, base[2] + 3};
  const float run_logits[3] = {run[0] - 1, run[1] - 1, run[2] - 1};
  raw.AddLogits(base_logits, run_logits, 3, 0);
  EXPECT_NEAR(raw.mean_kl(), 0.25 * std::log(2.0), 1e-6);
  EXPECT_NEAR(raw.ppl(), 4.0, 1e-5);
  EXPECT_NEAR(raw.base_ppl(), 2.0, 1e-5);
  EXPECT_EQ(raw.top1(), 0.0);
  KlStats floored;  // the base's 0.25 terms left out: KL = 0.5 * ln(0.5 / 0.25)
  floored.Add(base, run, 3, 0, std::log(0.3f));
  EXPECT_NEAR(floored.mean_kl(), 0.5 * std::log(2.0), 1e-6);
}

}  // namespace
}  // namespace moeshard
