// SafetensorsCheckpoint on the testdata checkpoints (bf16 hub layout, NVFP4 triplets with
// scalar shapes, goldens), on files written by WriteSafetensors, and on a sharded checkpoint
// (two shards + model.safetensors.index.json) built in a temp folder.
#include "common/formats/safetensors.h"

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/formats/format_test_util.h"

namespace moeshard {
namespace {

using test::TempDir;
using ::testing::ElementsAre;

std::string F32Bytes(std::vector<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

TEST(SafetensorsWriteTest, RoundTripsTensorsAndMetadata) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.Path("t.safetensors");
  std::vector<TensorToWrite> tensors = {
      {"w", DType::kF32, {2, 2}, F32Bytes({1, 2, 3, 4})},
      {"b", DType::kBF16, {3}, test::Bytes(6, 9)},
      {"s", DType::kF32, {}, F32Bytes({7})},
      {"e", DType::kU8, {0, 5}, ""},
  };
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());

  auto bytes = ReadFileToString(path);
  ASSERT_TRUE(bytes.ok());
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes->data(), 8);
  EXPECT_EQ(header_len % 8, 0u) << "header must be padded to a multiple of 8";

  auto ckpt = SafetensorsCheckpoint::OpenFile(path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_THAT((*ckpt)->Names(), ElementsAre("b", "e", "s", "w"));
  EXPECT_EQ((*ckpt)->metadata().at("format"), "pt");
  for (const TensorToWrite& want : tensors) {
    SCOPED_TRACE(want.name);
    const TensorInfo* t = (*ckpt)->Find(want.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, want.dtype);
    EXPECT_EQ(t->shape, want.shape);
    ASSERT_EQ(t->nbytes, want.bytes.size());
    EXPECT_EQ(std::memcmp(t->data, want.bytes.data(), t->nbytes), 0);
  }
  EXPECT_EQ((*ckpt)->Find("s")->numel(), 1);
  EXPECT_EQ((*ckpt)->Find("missing"), nullptr);
}

TEST(SafetensorsWriteTest, RefusesBadInput) {
  TempDir dir;
  const std::string path = dir.Path("bad.safetensors");
  struct Case {
    const char* what;
    std::vector<TensorToWrite> tensors;
  };
  const Case cases[] = {
      {"byte count does not match shape", {{"w", DType::kF32, {2}, "abc"}}},
      {"repeated name", {{"w", DType::kU8, {1}, "a"}, {"w", DType::kU8, {1}, "b"}}},
      {"reserved name", {{"__metadata__", DType::kU8, {1}, "a"}}},
      {"empty name", {{"", DType::kU8, {1}, "a"}}},
      {"block dtype", {{"q", DType::kQ8_0, {32}, std::string(34, '\0')}}},
      {"negative dim", {{"w", DType::kU8, {-1}, ""}}},
      {"invalid UTF-8 name", {{"\xff\xfe", DType::kU8, {1}, "a"}}},
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(WriteSafetensors(path, c.tensors).ok()) << c.what;
  }
  EXPECT_FALSE(WriteSafetensors(dir.Path("no/such/folder/x.safetensors"), {}).ok());
}

TEST(SafetensorsShardedTest, OpensIndexAndShards) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(WriteSafetensors(dir.Path("model-00001-of-00002.safetensors"),
                               {{"a", DType::kF32, {2}, F32Bytes({1, 2})},
                                {"b", DType::kF32, {1}, F32Bytes({3})},
                                {"unindexed", DType::kU8, {1}, "z"}},
                               {{"format", "pt"}})
                  .ok());
  ASSERT_TRUE(WriteSafetensors(dir.Path("model-00002-of-00002.safetensors"),
                               {{"c", DType::kBF16, {2, 1}, test::Bytes(4, 1)}})
                  .ok());
  ASSERT_TRUE(test::WriteFile(dir.Path("model.safetensors.index.json"), R"({
      "metadata": {"total_size": 16},
      "weight_map": {"a": "model-00001-of-00002.safetensors",
                     "b": "model-00001-of-00002.safetensors",
                     "c": "model-00002-of-00002.safetensors"}})"));
  for (const std::string& path : {dir.path(), dir.Path("model.safetensors.index.json")}) {
    SCOPED_TRACE(path);
    auto ckpt = SafetensorsCheckpoint::Open(path);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    EXPECT_THAT((*ckpt)->Names(), ElementsAre("a", "b", "c"));
    EXPECT_EQ((*ckpt)->metadata().at("format"), "pt");
    const TensorInfo* a = (*ckpt)->Find("a");
    ASSERT_NE(a, nullptr);
    float v[2];
    std::memcpy(v, a->data, 8);
    EXPECT_EQ(v[0], 1.0f);
    EXPECT_EQ(v[1], 2.0f);
    const TensorInfo* c = (*ckpt)->Find("c");
    ASSERT_NE(c, nullptr);
    EXPECT_THAT(c->shape, ElementsAre(2, 1));
    EXPECT_EQ(std::memcmp(c->data, test::Bytes(4, 1).data(), 4), 0);
  }
}

TEST(SafetensorsShardedTest, FolderWithSingleFileAndMissingFolder) {
  TempDir dir;
  ASSERT_TRUE(
      WriteSafetensors(dir.Path("model.safetensors"), {{"x", DType::kI32, {1}, "abcd"}}).ok());
  auto ckpt = SafetensorsCheckpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_NE((*ckpt)->Find("x"), nullptr);
  absl::Status missing = SafetensorsCheckpoint::Open(dir.Path("nope")).status();
  EXPECT_TRUE(absl::IsNotFound(missing)) << missing;
}

// ---- the testdata checkpoints ----

class SafetensorsTestdataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::TestdataDir();
    ASSERT_TRUE(std::filesystem::is_directory(dir_)) << "no test models at '" << dir_ << "'";
  }
  std::string dir_;
};

TEST_F(SafetensorsTestdataTest, Qwen3MoeTiny) {
  auto ckpt = SafetensorsCheckpoint::Open(dir_ + "/qwen3moe-tiny");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  // The header has 136 keys: 135 tensors and "__metadata__".
  EXPECT_EQ((*ckpt)->Names().size(), 135u);
  EXPECT_EQ((*ckpt)->Find("__metadata__"), nullptr);
  EXPECT_EQ((*ckpt)->metadata().at("format"), "pt");
  for (const std::string& name : (*ckpt)->Names()) {
    EXPECT_EQ((*ckpt)->Find(name)->dtype, DType::kBF16) << name;
  }
  const TensorInfo* down = (*ckpt)->Find("model.layers.0.mlp.experts.0.down_proj.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_THAT(down->shape, ElementsAre(64, 32));
  EXPECT_EQ(down->nbytes, 64u * 32 * 2);
  const TensorInfo* embed = (*ckpt)->Find("model.embed_tokens.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_THAT(embed->shape, ElementsAre(512, 64));
}

TEST_F(SafetensorsTestdataTest, MuseSparkNvfp4) {
  auto ckpt = SafetensorsCheckpoint::OpenFile(dir_ + "/muse-spark-tiny-nvfp4/model.safetensors");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->Names().size(), 1283u);
  const std::string base = "model.layers.0.mlp.experts.0.down_proj.weight";
  const TensorInfo* w = (*ckpt)->Find(base);
  const TensorInfo* scale = (*ckpt)->Find(base + "_scale");
  const TensorInfo* scale2 = (*ckpt)->Find(base + "_scale_2");
  ASSERT_NE(w, nullptr);
  ASSERT_NE(scale, nullptr);
  ASSERT_NE(scale2, nullptr);
  EXPECT_EQ(w->dtype, DType::kU8);
  EXPECT_THAT(w->shape, ElementsAre(64, 32));
  EXPECT_EQ(scale->dtype, DType::kF8E4M3);
  EXPECT_THAT(scale->shape, ElementsAre(64, 4));
  EXPECT_EQ(scale2->dtype, DType::kF32);
  EXPECT_TRUE(scale2->shape.empty());
  EXPECT_EQ(scale2->numel(), 1);
  EXPECT_EQ(scale2->nbytes, 4u);
}

TEST_F(SafetensorsTestdataTest, Goldens) {
  auto ckpt = SafetensorsCheckpoint::OpenFile(dir_ + "/qwen3moe-tiny/goldens.safetensors");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->Names().size(), 11u);
  EXPECT_TRUE((*ckpt)->metadata().empty());
  const TensorInfo* ids = (*ckpt)->Find("seq0.ids");
  ASSERT_NE(ids, nullptr);
  EXPECT_EQ(ids->dtype, DType::kI32);
  EXPECT_THAT(ids->shape, ElementsAre(7));
  const TensorInfo* logits = (*ckpt)->Find("seq2.logits");
  ASSERT_NE(logits, nullptr);
  EXPECT_EQ(logits->dtype, DType::kF32);
  EXPECT_THAT(logits->shape, ElementsAre(100, 512));
  EXPECT_EQ(logits->nbytes, 100u * 512 * 4);
}

}  // namespace
}  // namespace moeshard
