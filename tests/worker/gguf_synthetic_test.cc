// `make-model --synthetic` / `--preset full` (WriteSyntheticGguf): the streamed writer of
// large GGUF files.
//  (a) the file has the tensors, types, shapes and metadata of WriteRandomGguf's file of the
//      same spec (which gguf_export_test checks against llama.cpp's loader);
//  (b) its bytes do not depend on the number of writer threads;
//  (c) each block-quantized matrix, expanded as the engine does, has the spread the hub
//      weights have (1 / sqrt(row length)), norms scatter around one;
//  (d) the CPU engine loads it (Q8_0 embedding and projections, MXFP4 or Q8_0 experts) and
//      its logits are finite and not all equal;
//  (e) --preset full is the Qwen3-30B-A3B shape.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "eval/random_model.h"
#include "eval/random_model_gguf.h"
#include "common/formats/gguf.h"
#include "common/formats/gguf_quant.h"
#include "common/model/model_config.h"
#include "gtest/gtest.h"
#include "kernels/cpu/dequant.h"
#include "tests/worker/gguf_test_util.h"
#include "common/model/model_loader.h"

namespace moeshard {
namespace {

RandomModelSpec SmallSpec() {
  RandomModelSpec s;
  s.arch = "qwen3_moe";
  s.preset = "tiny";
  s.seed = 3;
  return s;
}

GgufExportOptions Q8Dense(GgmlType experts) {
  GgufExportOptions o;
  o.expert_type = experts;
  o.dense_type = GgmlType::kQ8_0;
  return o;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Every value of a Q8_0 or MXFP4 tensor as the engine expands it.
std::vector<float> Expand(const TensorInfo& t) {
  const bool q8 = t.dtype == DType::kQ8_0;
  const int64_t block = q8 ? kQ8_0BlockBytes : kMxfp4BlockBytes;
  std::vector<float> v(t.numel());
  for (int64_t b = 0; b < t.numel() / 32; ++b) {
    if (q8) {
      DequantQ8_0Block(t.data + b * block, v.data() + 32 * b);
    } else {
      DequantMxfp4Block(t.data + b * block, v.data() + 32 * b);
    }
  }
  return v;
}

double Rms(const std::vector<float>& v, double center = 0) {
  double s = 0;
  for (float x : v) s += (x - center) * (x - center);
  return std::sqrt(s / v.size());
}

TEST(GgufSyntheticTest, SameLayoutAndMetadataAsTheRandomFile) {
  test::TempDir dir;
  ASSERT_TRUE(dir.ok());
  for (GgmlType experts : {GgmlType::kMXFP4, GgmlType::kQ8_0}) {
    const GgufExportOptions o = Q8Dense(experts);
    ASSERT_TRUE(WriteRandomGguf(SmallSpec(), o, dir.Path("r.gguf")).ok());
    absl::Status st = WriteSyntheticGguf(SmallSpec(), o, dir.Path("s.gguf"), 3);
    ASSERT_TRUE(st.ok()) << st;
    auto r = GgufFile::Open(dir.Path("r.gguf"));
    auto s = GgufFile::Open(dir.Path("s.gguf"));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_EQ((*r)->Names(), (*s)->Names());
    for (const std::string& n : (*r)->Names()) {
      const TensorInfo *a = (*r)->Find(n), *b = (*s)->Find(n);
      EXPECT_EQ(a->dtype, b->dtype) << n;
      EXPECT_EQ(a->shape, b->shape) << n;
      EXPECT_EQ(a->nbytes, b->nbytes) << n;
    }
    for (const char* k : {"qwen3moe.block_count", "qwen3moe.expert_count", "qwen3moe.embedding_length",
                          "general.file_type"}) {
      EXPECT_EQ(*(*r)->GetInt(k), *(*s)->GetInt(k)) << k;
    }
    EXPECT_EQ(**(*r)->GetStringArray("tokenizer.ggml.tokens"), **(*s)->GetStringArray("tokenizer.ggml.tokens"));
    EXPECT_EQ(std::filesystem::file_size(dir.Path("r.gguf")), std::filesystem::file_size(dir.Path("s.gguf")));
  }
}

TEST(GgufSyntheticTest, BytesDoNotDependOnTheThreadCount) {
  test::TempDir dir;
  ASSERT_TRUE(dir.ok());
  const GgufExportOptions o = Q8Dense(GgmlType::kMXFP4);
  ASSERT_TRUE(WriteSyntheticGguf(SmallSpec(), o, dir.Path("a.gguf"), 1).ok());
  ASSERT_TRUE(WriteSyntheticGguf(SmallSpec(), o, dir.Path("b.gguf"), 5).ok());
  const std::string a = ReadAll(dir.Path("a.gguf")), b = ReadAll(dir.Path("b.gguf"));
  ASSERT_GT(a.size(), 100000u);
  EXPECT_TRUE(a == b);
  RandomModelSpec other = SmallSpec();
  other.seed = 4;
  ASSERT_TRUE(WriteSyntheticGguf(other, o, dir.Path("c.gguf"), 2).ok());
  EXPECT_FALSE(a == ReadAll(dir.Path("c.gguf")));
}

TEST(GgufSyntheticTest, WeightsHaveTheSpreadOfTheHubWeights) {
  test::TempDir dir;
  ASSERT_TRUE(dir.ok());
  for (GgmlType experts : {GgmlType::kMXFP4, GgmlType::kQ8_0}) {
    ASSERT_TRUE(WriteSyntheticGguf(SmallSpec(), Q8Dense(experts), dir.Path("s.gguf"), 2).ok());
    auto g = GgufFile::Open(dir.Path("s.gguf"));
    ASSERT_TRUE(g.ok()) << g.status();
    for (const char* n : {"blk.0.attn_q.weight", "blk.1.attn_output.weight", "blk.0.ffn_gate_exps.weight",
                          "blk.2.ffn_down_exps.weight", "output.weight", "token_embd.weight"}) {
      const TensorInfo* t = (*g)->Find(n);
      ASSERT_NE(t, nullptr) << n;
      const double cols = static_cast<double>(t->shape.back());
      double want = 1.0 / std::sqrt(cols);
      if (std::string(n) == "token_embd.weight") want = 1.0;
      if (std::string(n) == "output.weight") want = 2.0 / std::sqrt(cols);
      const double rms = Rms(Expand(*t));
      // MXFP4 scales are powers of two: the spread lands within a factor sqrt(2).
      const double tol = t->dtype == DType::kMXFP4 ? 1.45 : 1.05;
      EXPECT_LT(rms, want * tol) << n;
      EXPECT_GT(rms, want / tol) << n;
    }
    const TensorInfo* norm = (*g)->Find("blk.0.attn_norm.weight");
    ASSERT_NE(norm, nullptr);
    std::vector<float> v(reinterpret_cast<const float*>(norm->data),
                         reinterpret_cast<const float*>(norm->data) + norm->numel());
    EXPECT_NEAR(Rms(v, 1.0), 0.1, 0.03);
  }
}

TEST(GgufSyntheticTest, TheCpuEngineRunsIt) {
  test::TempDir dir;
  ASSERT_TRUE(dir.ok());
  for (GgmlType experts : {GgmlType::kMXFP4, GgmlType::kQ8_0}) {
    ASSERT_TRUE(WriteSyntheticGguf(SmallSpec(), Q8Dense(experts), dir.Path("s.gguf"), 2).ok());
    auto m = LoadModel(dir.Path("s.gguf"), /*load_tokenizer=*/true);
    ASSERT_TRUE(m.ok()) << m.status();
    const std::vector<int32_t> ids = {1, 17, 300, 42, 5};
    auto logits = test::Logits(*m, ids);
    ASSERT_TRUE(logits.ok()) << logits.status();
    ASSERT_EQ(logits->size(), ids.size() * m->config.vocab_size);
    float lo = (*logits)[0], hi = lo;
    for (float x : *logits) {
      ASSERT_TRUE(std::isfinite(x));
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    EXPECT_GT(hi - lo, 0.1f);
  }
}

TEST(GgufSyntheticTest, PresetFullIsQwen3_30B_A3B) {
  RandomModelSpec s;
  s.arch = "qwen3_moe";
  s.preset = "full";
  auto hf = RandomModelConfig(s);
  ASSERT_TRUE(hf.ok()) << hf.status();
  auto c = ParseHfConfig(*hf);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_layers, 48);
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_EQ(c->num_heads, 32);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_experts, 128);
  EXPECT_EQ(c->top_k, 8);
  EXPECT_EQ(c->expert_intermediate, 768);
  EXPECT_EQ(c->vocab_size, 151936);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  s.arch = "muse_spark";
  EXPECT_FALSE(RandomModelConfig(s).ok());
}

}  // namespace
}  // namespace moeshard
