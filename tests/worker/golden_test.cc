// The engine against the shared goldens (computed by Hugging Face transformers and by the
// reference muse_spark.py, not by us): every position of seq0-2 whole, batched and as
// prefill + decode steps, and gen0's greedy tokens, for every testdata model and format.
#include <cstdlib>
#include <filesystem>
#include <string>

#include "eval/golden_check.h"
#include "gtest/gtest.h"
#include "tests/testdata/testdata_dir.h"
#include "common/model/model_loader.h"

namespace moeshard {
namespace {

std::string TestData() { return test::TestDataDir(); }

struct Case {
  const char* model;    // path under testdata
  const char* goldens;  // path under testdata
  Tolerance tol;
};

class GoldenTest : public ::testing::TestWithParam<Case> {};

TEST_P(GoldenTest, MatchesReference) {
  const Case& c = GetParam();
  std::string model = TestData() + "/" + c.model, goldens = TestData() + "/" + c.goldens;
  ASSERT_TRUE(std::filesystem::exists(model)) << "no test model at " << model;
  auto m = LoadModel(model, /*load_tokenizer=*/false);
  ASSERT_TRUE(m.ok()) << m.status();
  auto rep = CheckModel(*m, goldens, c.tol);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->seqs.size(), 9u);  // 3 sequences x (whole, batched, decode)
  EXPECT_EQ(rep->gens.size(), 1u);
  EXPECT_TRUE(rep->pass()) << rep->Format();
  if (c.tol == Tolerance::kFp32) {
    for (const auto& s : rep->seqs) EXPECT_EQ(s.top1, 1.0) << s.name;
  }
}

// model-q8_0.gguf against goldens that transformers computed on exactly the file's weights
// (its Q8_0 tensors dequantized as ggml does; tests/testdata/q8_0_reference.py): the strict
// fp32 tolerance holds, so the engine computes what the file holds. The loose Q8_0 profile
// above measures the quantization itself against the unquantized goldens.
TEST(GoldenQ8Test, MatchesTransformersOnTheFilesOwnWeights) {
  std::string model = TestData() + "/qwen3moe-tok/model-q8_0.gguf";
  ASSERT_TRUE(std::filesystem::exists(model)) << "no test model at " << model;
  auto m = LoadModel(model, /*load_tokenizer=*/false);
  ASSERT_TRUE(m.ok()) << m.status();
  auto rep = CheckModel(*m, TestData() + "/qwen3moe-tok-q8_0/goldens.safetensors", Tolerance::kFp32);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->seqs.size(), 9u);
  EXPECT_TRUE(rep->pass()) << rep->Format();
  for (const auto& s : rep->seqs) EXPECT_EQ(s.top1, 1.0) << s.name;
}

// The runs a CheckLayout names, and decode_steps: only those run, each checking every position.
TEST(GoldenRunsTest, RunsAndDecodeSteps) {
  auto m = LoadModel(TestData() + "/muse-spark-tiny", /*load_tokenizer=*/false);
  ASSERT_TRUE(m.ok()) << m.status();
  CheckLayout layout;
  auto runs = ParseRuns("decode,whole");
  ASSERT_TRUE(runs.ok()) << runs.status();
  layout.runs = *runs;
  layout.decode_steps = 3;  // prefill of all but the last 3 positions, then 3 decode steps
  auto rep = CheckModel(*m, TestData() + "/muse-spark-tiny/goldens.safetensors", Tolerance::kFp32, layout);
  ASSERT_TRUE(rep.ok()) << rep.status();
  ASSERT_EQ(rep->seqs.size(), 6u);  // 3 sequences x (whole, decode): no batched run
  EXPECT_EQ(rep->seqs[0].name, "seq0 whole");
  EXPECT_EQ(rep->seqs[3].name, "seq0 decode");
  EXPECT_EQ(rep->seqs[5].positions, 100);
  EXPECT_TRUE(rep->pass()) << rep->Format();
  EXPECT_FALSE(ParseRuns("whole,bogus").ok());
  EXPECT_FALSE(ParseRuns("").ok());
}

INSTANTIATE_TEST_SUITE_P(
    TestData, GoldenTest,
    ::testing::Values(Case{"qwen3moe-tiny", "qwen3moe-tiny/goldens.safetensors", Tolerance::kFp32},
                      Case{"muse-spark-tiny", "muse-spark-tiny/goldens.safetensors", Tolerance::kFp32},
                      Case{"muse-spark-tiny-nvfp4", "muse-spark-tiny-nvfp4/goldens.safetensors", Tolerance::kFp32},
                      Case{"muse-spark-kv4", "muse-spark-kv4/goldens.safetensors", Tolerance::kFp32},
                      Case{"qwen3moe-tok", "qwen3moe-tok/goldens.safetensors", Tolerance::kFp32},
                      Case{"qwen3moe-tok/model-f16.gguf", "qwen3moe-tok/goldens.safetensors", Tolerance::kFp32},
                      Case{"qwen3moe-tok/model-q8_0.gguf", "qwen3moe-tok/goldens.safetensors", Tolerance::kQ8_0}),
    [](const ::testing::TestParamInfo<Case>& i) {
      std::string n = i.param.model;
      for (auto& ch : n) {
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return n;
    });

}  // namespace
}  // namespace moeshard
