// GgufFile on a tiny file written by the test (every value kind, every supported tensor type,
// one unsupported type) and on the llama.cpp-written qwen3moe-tok files from testdata, whose
// f16 token embedding must equal the bf16 safetensors one (proves offsets and padding).
#include "common/formats/gguf.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/formats/format_test_util.h"

namespace moeshard {
namespace {

using test::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<std::unique_ptr<GgufFile>> OpenBytes(const TempDir& dir, const std::string& bytes) {
  const std::string path = dir.Path("tiny.gguf");
  if (!test::WriteFile(path, bytes)) return absl::InternalError("cannot write " + path);
  return GgufFile::Open(path);
}

TEST(GgufTinyTest, ReadsMetadataOfEveryKind) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto g = OpenBytes(dir, test::BuildGguf(test::TinyGgufSpec()));
  ASSERT_TRUE(g.ok()) << g.status();
  const GgufFile& f = **g;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.GetString("general.architecture").value_or(""), "tiny");
  EXPECT_EQ(f.GetInt("tiny.block_count").value_or(0), 2);
  EXPECT_EQ(f.GetInt("tiny.neg").value_or(0), -5);
  EXPECT_EQ(f.GetInt("tiny.big").value_or(0), int64_t{1} << 40);
  EXPECT_EQ(f.GetInt("tiny.small").value_or(0), 7);
  EXPECT_EQ(f.GetFloat("tiny.eps").value_or(0), 0.5);
  EXPECT_EQ(f.GetFloat("tiny.f64").value_or(0), 0.25);
  EXPECT_EQ(f.GetFloat("tiny.block_count").value_or(0), 2.0);  // ints read as floats
  EXPECT_TRUE(f.GetBool("tiny.flag").value_or(false));
  auto tokens = f.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_THAT(**tokens, ElementsAre("a", "bc", ""));
  auto types = f.GetIntArray("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.ok()) << types.status();
  EXPECT_THAT(**types, ElementsAre(1, -2, 3));
  auto bools = f.GetIntArray("tiny.bools");
  ASSERT_TRUE(bools.ok()) << bools.status();
  EXPECT_THAT(**bools, ElementsAre(1, 0));
  ASSERT_NE(f.Get("tiny.floats"), nullptr);
  EXPECT_THAT(f.Get("tiny.floats")->floats, ElementsAre(1.0));
  EXPECT_TRUE(f.Has("general.alignment"));
  EXPECT_FALSE(f.Has("nope"));
}

TEST(GgufTinyTest, TypedGettersNameKeyAndKinds) {
  TempDir dir;
  auto g = OpenBytes(dir, test::BuildGguf(test::TinyGgufSpec()));
  ASSERT_TRUE(g.ok()) << g.status();
  absl::Status missing = (*g)->GetInt("no.such.key").status();
  EXPECT_TRUE(absl::IsNotFound(missing)) << missing;
  EXPECT_THAT(missing.message(), HasSubstr("no.such.key"));
  absl::Status wrong = (*g)->GetInt("general.architecture").status();
  EXPECT_TRUE(absl::IsInvalidArgument(wrong)) << wrong;
  EXPECT_THAT(wrong.message(), HasSubstr("general.architecture"));
  EXPECT_THAT(wrong.message(), HasSubstr("string"));
  EXPECT_FALSE((*g)->GetStringArray("tokenizer.ggml.token_type").ok());
  EXPECT_FALSE((*g)->GetBool("tiny.block_count").ok());
}

TEST(GgufTinyTest, TensorsHaveReversedShapesSizesAndData) {
  TempDir dir;
  const test::GgufSpec spec = test::TinyGgufSpec();
  auto g = OpenBytes(dir, test::BuildGguf(spec));
  ASSERT_TRUE(g.ok()) << g.status();
  struct Want {
    const char* name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t nbytes;
  };
  const Want wants[] = {
      {"f32", DType::kF32, {2, 3}, 24},   {"f16", DType::kF16, {4}, 8},
      {"bf16", DType::kBF16, {2, 2}, 8},  {"mxfp4", DType::kMXFP4, {2, 32}, 34},
      {"q8", DType::kQ8_0, {3, 32}, 102},
  };
  for (const Want& w : wants) {
    SCOPED_TRACE(w.name);
    const TensorInfo* t = (*g)->Find(w.name);
    ASSERT_NE(t, nullptr);
    EXPECT_TRUE((*g)->TensorStatus(w.name).ok());
    EXPECT_EQ(t->dtype, w.dtype);
    EXPECT_EQ(t->shape, w.shape);
    EXPECT_EQ(t->nbytes, w.nbytes);
    const auto& src =
        *std::find_if(spec.tensors.begin(), spec.tensors.end(),
                      [&](const test::GgufTensorSpec& s) { return s.name == w.name; });
    ASSERT_EQ(src.data.size(), t->nbytes);
    EXPECT_EQ(std::memcmp(src.data.data(), t->data, t->nbytes), 0);
  }
  EXPECT_THAT((*g)->Names(), ElementsAre("bf16", "f16", "f32", "mxfp4", "q8"));
}

TEST(GgufTinyTest, UnsupportedTypeLoadsButIsReported) {
  TempDir dir;
  auto g = OpenBytes(dir, test::BuildGguf(test::TinyGgufSpec()));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->Find("q4k"), nullptr);
  absl::Status st = (*g)->TensorStatus("q4k");
  EXPECT_TRUE(absl::IsUnimplemented(st)) << st;
  EXPECT_EQ(st.message(), "unsupported ggml type 12 for tensor q4k");
  EXPECT_TRUE(absl::IsNotFound((*g)->TensorStatus("absent")));
  EXPECT_EQ((*g)->unsupported_tensors().count("q4k"), 1u);
}

TEST(GgufTinyTest, AcceptsVersion2EmptyFileAndOtherAlignment) {
  TempDir dir;
  test::GgufSpec v2 = test::TinyGgufSpec();
  v2.version = 2;
  auto g = OpenBytes(dir, test::BuildGguf(v2));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->version(), 2u);

  auto empty = OpenBytes(dir, test::BuildGguf(test::GgufSpec{}));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE((*empty)->Names().empty());

  test::GgufSpec a64 = test::TinyGgufSpec();
  a64.kvs[1] = test::KvU32("general.alignment", 64);
  a64.alignment = 64;
  auto g64 = OpenBytes(dir, test::BuildGguf(a64));
  ASSERT_TRUE(g64.ok()) << g64.status();
  ASSERT_NE((*g64)->Find("q8"), nullptr);
  EXPECT_EQ(std::memcmp((*g64)->Find("q8")->data, a64.tensors.back().data.data(), 102), 0);
}

// ---- the real llama.cpp-written files ----

class GgufTestdataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::TestdataDir();
    ASSERT_TRUE(std::filesystem::is_directory(dir_)) << "no test models at '" << dir_ << "'";
  }
  std::string dir_;
};

TEST_F(GgufTestdataTest, Q8MetadataAndTensors) {
  const auto start = std::chrono::steady_clock::now();
  auto g = GgufFile::Open(dir_ + "/qwen3moe-tok/model-q8_0.gguf");
  const double open_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_LT(open_ms, 1000.0) << "parsing a 151936-token vocabulary should take well under 1 s";
  const GgufFile& f = **g;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.GetString("general.architecture").value_or(""), "qwen3moe");
  EXPECT_EQ(f.GetInt("qwen3moe.block_count").value_or(0), 2);
  EXPECT_EQ(f.GetInt("qwen3moe.expert_count").value_or(0), 8);
  EXPECT_NEAR(f.GetFloat("qwen3moe.rope.freq_base").value_or(0), 1e6, 1e-3);
  EXPECT_FALSE(f.GetBool("tokenizer.ggml.add_bos_token").value_or(true));
  auto tokens = f.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ((*tokens)->size(), 151936u);
  EXPECT_EQ((**tokens)[0], "!");
  auto merges = f.GetStringArray("tokenizer.ggml.merges");
  ASSERT_TRUE(merges.ok()) << merges.status();
  EXPECT_EQ((*merges)->size(), 151387u);
  auto token_type = f.GetIntArray("tokenizer.ggml.token_type");
  ASSERT_TRUE(token_type.ok()) << token_type.status();
  EXPECT_EQ((*token_type)->size(), 151936u);

  EXPECT_EQ(f.Names().size(), 26u);
  EXPECT_TRUE(f.unsupported_tensors().empty());
  const TensorInfo* down = f.Find("blk.0.ffn_down_exps.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->dtype, DType::kQ8_0);
  EXPECT_THAT(down->shape, ElementsAre(8, 48, 32));
  EXPECT_EQ(down->nbytes, 8u * 48 * 34);
  const TensorInfo* gate = f.Find("blk.0.ffn_gate_exps.weight");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->dtype, DType::kF16);
  EXPECT_THAT(gate->shape, ElementsAre(8, 32, 48));
  const TensorInfo* norm = f.Find("blk.0.attn_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->dtype, DType::kF32);
  EXPECT_THAT(norm->shape, ElementsAre(48));
}

TEST_F(GgufTestdataTest, F16EmbeddingMatchesSafetensors) {
  auto g = GgufFile::Open(dir_ + "/qwen3moe-tok/model-f16.gguf");
  ASSERT_TRUE(g.ok()) << g.status();
  auto st = SafetensorsCheckpoint::Open(dir_ + "/qwen3moe-tok");
  ASSERT_TRUE(st.ok()) << st.status();
  const TensorInfo* ge = (*g)->Find("token_embd.weight");
  const TensorInfo* se = (*st)->Find("model.embed_tokens.weight");
  ASSERT_NE(ge, nullptr);
  ASSERT_NE(se, nullptr);
  EXPECT_EQ(ge->dtype, DType::kF16);
  EXPECT_EQ(se->dtype, DType::kBF16);
  ASSERT_EQ(ge->shape, se->shape);
  EXPECT_THAT(ge->shape, ElementsAre(151936, 48));
  const int64_t cols = 48;
  for (int64_t row : {int64_t{0}, int64_t{1}, int64_t{12345}, int64_t{100000}, int64_t{151935}}) {
    for (int64_t c = 0; c < cols; ++c) {
      uint16_t h, b;
      std::memcpy(&h, ge->data + 2 * (row * cols + c), 2);
      std::memcpy(&b, se->data + 2 * (row * cols + c), 2);
      ASSERT_EQ(F16ToF32(h), Bf16ToF32(b)) << "row " << row << " col " << c;
    }
  }
  // A tensor after the big embedding: its offset depends on every earlier one.
  const TensorInfo* gd = (*g)->Find("blk.1.ffn_down_exps.weight");
  const TensorInfo* sd = (*st)->Find("model.layers.1.mlp.experts.7.down_proj.weight");
  ASSERT_NE(gd, nullptr);
  ASSERT_NE(sd, nullptr);
  ASSERT_EQ(gd->dtype, DType::kF16);
  EXPECT_THAT(gd->shape, ElementsAre(8, 48, 32));
  EXPECT_THAT(sd->shape, ElementsAre(48, 32));
  for (int64_t i = 0; i < 48 * 32; ++i) {
    uint16_t h, b;
    std::memcpy(&h, gd->data + 2 * (7 * 48 * 32 + i), 2);
    std::memcpy(&b, sd->data + 2 * i, 2);
    ASSERT_EQ(F16ToF32(h), Bf16ToF32(b)) << "element " << i;
  }
}

}  // namespace
}  // namespace moeshard
