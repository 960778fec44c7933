// The bundled demo model (models/muse-spark-demo) against the PyTorch reference on held-out
// text.
// - KL: every sequence of its goldens.safetensors that keeps full logits (seq0: the first 24
//   tokens of the validation chapters; the others are narrowed to top-20, which `moeshard check`
//   covers) runs through the CPU engine, and KL(PyTorch float64 || engine) of each next-token
//   prediction must stay at float32 noise (kMaxMeanKl, kMaxKl), with the same top token everywhere.
// - Perplexity: the model card's validation split (tests/worker/data/kjv-validation.txt: every
//   50th chapter from the 8th, as tools/train_demo/train.py holds out) evaluated as train.py's
//   eval_loss does (chapters tokenized one by one and concatenated, non-overlapping windows of
//   256 tokens, every position scored) must give the card's perplexity within 1 %.
// The figures are printed.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "eval/kl_stats.h"
#include "common/formats/safetensors.h"
#include "gtest/gtest.h"
#include "common/model/model_loader.h"
#include "worker/model_runner.h"

namespace moeshard {
namespace {

// Measured 2026-12-01 on the CPU: mean 2.7e-13, max 7.6e-13 (float32 rounding alone).
constexpr double kMaxMeanKl = 1e-10, kMaxKl = 1e-9;
// models/muse-spark-demo/README.md: "as shipped (bf16 + NVFP4 experts)", validation perplexity.
constexpr double kCardPerplexity = 33.85;
constexpr int64_t kWindow = 256;  // tools/train_demo/train.py --ctx (its default), eval_loss's T

template <typename T>
std::vector<T> Values(const TensorInfo& t) {
  std::vector<T> v(t.nbytes / sizeof(T));
  std::memcpy(v.data(), t.data, v.size() * sizeof(T));
  return v;
}

std::string DemoDir() { return std::string(MOESHARD_SOURCE_DIR) + "/models/muse-spark-demo"; }

// Logits of every position of `ids`, run from position 0.
std::vector<float> AllLogits(ModelRunner& runner, const RunnerOptions& ro, const std::vector<int32_t>& ids) {
  const int64_t T = ids.size();
  EXPECT_LE(T, ro.num_kv_blocks * ro.block_size);
  std::vector<int32_t> table;
  for (int64_t b = 0; b * ro.block_size < T; ++b) table.push_back(b);
  std::vector<float> got;
  EXPECT_TRUE(runner.Forward({SeqChunk{ids, 0, table, true}}, &got).ok());
  return got;
}

TEST(DemoModelKlTest, HeldOutTextMatchesPyTorch) {
  const std::string dir = DemoDir();
  auto m = LoadModel(dir, /*load_tokenizer=*/false);
  ASSERT_TRUE(m.ok()) << m.status();
  auto goldens = SafetensorsCheckpoint::OpenFile(dir + "/goldens.safetensors");
  ASSERT_TRUE(goldens.ok()) << goldens.status();
  const ModelConfig& c = m->config;
  const int64_t V = c.vocab_size;
  RunnerOptions ro;
  auto runner = ModelRunner::Create(c, *m->source, {0, c.num_layers, 0, 1, true, true}, ro);
  ASSERT_TRUE(runner.ok()) << runner.status();

  KlStats all;
  for (int k = 0; (*goldens)->Find(absl::StrCat("seq", k, ".ids")) != nullptr; ++k) {
    const TensorInfo* logits = (*goldens)->Find(absl::StrCat("seq", k, ".logits"));
    if (logits == nullptr) continue;  // top-k only
    const std::vector<int32_t> ids = Values<int32_t>(*(*goldens)->Find(absl::StrCat("seq", k, ".ids")));
    const std::vector<float> ref = Values<float>(*logits);
    const int64_t T = ids.size();
    ASSERT_EQ(logits->dtype, DType::kF32);
    ASSERT_EQ(static_cast<int64_t>(ref.size()), T * V);
    const std::vector<float> got = AllLogits(**runner, ro, ids);
    ASSERT_EQ(static_cast<int64_t>(got.size()), T * V);
    KlStats seq;
    for (int64_t t = 0; t + 1 < T; ++t) {
      seq.AddLogits(ref.data() + t * V, got.data() + t * V, V, ids[t + 1]);
      all.AddLogits(ref.data() + t * V, got.data() + t * V, V, ids[t + 1]);
    }
    std::printf("seq%d (%lld held-out tokens), base = PyTorch float64 logits, run = moeshard CPU:\n%s", k,
                static_cast<long long>(T), seq.Format().c_str());
  }
  ASSERT_GE(all.count(), 20) << "the goldens keep too few full-logit positions for a KL check";
  std::printf("demo model vs PyTorch: mean KL %.3g (limit %.0e), max KL %.3g (limit %.0e) over %lld positions\n",
              all.mean_kl(), kMaxMeanKl, all.max_kl(), kMaxKl, static_cast<long long>(all.count()));
  RecordProperty("mean_kl", absl::StrCat(all.mean_kl()));
  RecordProperty("max_kl", absl::StrCat(all.max_kl()));
  EXPECT_LE(all.mean_kl(), kMaxMeanKl);
  EXPECT_LE(all.max_kl(), kMaxKl);
  EXPECT_EQ(all.top1(), 1.0);
}

TEST(DemoModelKlTest, ValidationPerplexityIsTheModelCards) {
  auto m = LoadModel(DemoDir(), /*load_tokenizer=*/true);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_NE(m->tokenizer, nullptr);
  std::ifstream in(std::string(MOESHARD_SOURCE_DIR) + "/tests/worker/data/kjv-validation.txt");
  ASSERT_TRUE(in);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<int32_t> ids;
  int chapters = 0;
  for (absl::string_view ch : absl::StrSplit(text, "\n\n", absl::SkipWhitespace())) {
    auto enc = m->tokenizer->Encode(absl::StrCat(ch, "\n\n"));
    ASSERT_TRUE(enc.ok()) << enc.status();
    ids.insert(ids.end(), enc->begin(), enc->end());
    ++chapters;
  }
  ASSERT_EQ(chapters, 24);
  const ModelConfig& c = m->config;
  const int64_t V = c.vocab_size, T = kWindow;
  RunnerOptions ro;
  auto runner = ModelRunner::Create(c, *m->source, {0, c.num_layers, 0, 1, true, true}, ro);
  ASSERT_TRUE(runner.ok()) << runner.status();
  double nll = 0;
  int64_t count = 0;
  for (int64_t w = 0; (w + 1) * T + 1 <= static_cast<int64_t>(ids.size()); ++w) {
    const std::vector<int32_t> x(ids.begin() + w * T, ids.begin() + (w + 1) * T);
    const std::vector<float> logits = AllLogits(**runner, ro, x);
    ASSERT_EQ(static_cast<int64_t>(logits.size()), T * V);
    for (int64_t t = 0; t < T; ++t) {
      const float* row = logits.data() + t * V;
      double mx = row[0], sum = 0;
      for (int64_t v = 1; v < V; ++v) mx = std::max<double>(mx, row[v]);
      for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
      nll += mx + std::log(sum) - row[ids[w * T + t + 1]];
      ++count;
    }
  }
  const double ppl = std::exp(nll / count);
  std::printf("demo model: validation perplexity %.4f over %lld tokens (%d chapters); model card %.2f\n", ppl,
              static_cast<long long>(count), chapters, kCardPerplexity);
  RecordProperty("perplexity", absl::StrCat(ppl));
  EXPECT_NEAR(ppl, kCardPerplexity, 0.01 * kCardPerplexity);
}

}  // namespace
}  // namespace moeshard
