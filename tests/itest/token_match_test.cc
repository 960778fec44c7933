// itest's token comparison (tests/itest/token_match.h) against the in-process float32 engine on
// a real test model: exact mode refuses any difference; the bf16 tolerance accepts a parting
// only at a near tie of the float32 engine and names the position and both log-probabilities
// otherwise.
#include "tests/itest/token_match.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

#include "tests/itest/suite.h"

namespace moeshard::itest {
namespace {

class TokenMatchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto r = ReferenceEngine::Load(std::string(MOESHARD_TESTDATA_DIR) + "/muse-spark-tiny");
    ASSERT_TRUE(r.ok()) << r.status();
    ctx_ = new Context(ItestOptions{});
    ctx_->reference = *std::move(r);
  }
  static void TearDownTestSuite() { delete ctx_; }
  static Context* ctx_;
};
Context* TokenMatchTest::ctx_ = nullptr;

std::vector<int32_t> Prompt(int n, int seed) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((seed * 31 + i * 17) % 200);
  return p;
}

// The two best tokens after `seq` and their log-probabilities.
struct Top2 {
  int32_t best, second;
  double gap;
};
Top2 TopTwo(const std::vector<double>& lp) {
  std::vector<int32_t> idx(lp.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i);
  std::partial_sort(idx.begin(), idx.begin() + 2, idx.end(), [&](int32_t a, int32_t b) { return lp[a] > lp[b]; });
  return {idx[0], idx[1], lp[idx[0]] - lp[idx[1]]};
}

TEST_F(TokenMatchTest, ExactRefusesAnyDifference) {
  const auto prompt = Prompt(7, 1);
  auto want = ctx_->reference->Greedy(prompt, 6);
  ASSERT_TRUE(want.ok()) << want.status();
  ctx_->tolerance = Tolerance::kExact;
  EXPECT_TRUE(SameGreedy(*ctx_, prompt, *want, *want, "same").ok());
  auto got = *want;
  got[5] = (got[5] + 1) % 200;
  const absl::Status st = SameGreedy(*ctx_, prompt, *want, got, "one token");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("one token"), std::string::npos) << st;
}

TEST_F(TokenMatchTest, Bf16AcceptsANearTieAndRefusesAClearWinner) {
  ctx_->tolerance = Tolerance::kBf16;
  bool near = false, clear = false;
  for (int seed = 0; seed < 60 && !(near && clear); ++seed) {
    const auto prompt = Prompt(5 + seed % 7, seed);
    auto want = ctx_->reference->Greedy(prompt, 4);
    ASSERT_TRUE(want.ok()) << want.status();
    for (int i = 0; i < 4 && !(near && clear); ++i) {
      std::vector<int32_t> seq = prompt;
      seq.insert(seq.end(), want->begin(), want->begin() + i);
      auto rows = ctx_->reference->LogProbs(seq, 1);
      ASSERT_TRUE(rows.ok()) << rows.status();
      const Top2 t = TopTwo(rows->back());
      ASSERT_EQ(t.best, (*want)[i]);
      std::vector<int32_t> got(want->begin(), want->begin() + i);
      got.push_back(t.second);
      got.push_back(0);  // past the parting nothing is compared
      got.resize(want->size(), 0);
      const absl::Status st = SameGreedy(*ctx_, prompt, *want, got, "bf16");
      if (t.gap <= kBf16GreedyMargin) {
        EXPECT_TRUE(st.ok()) << "gap " << t.gap << ": " << st;
        near = true;
      } else {
        EXPECT_FALSE(st.ok()) << "gap " << t.gap;
        EXPECT_NE(st.message().find(absl::StrCat("at position ", i)), std::string::npos) << st;
        clear = true;
      }
    }
  }
  EXPECT_TRUE(near) << "no near tie found in 60 prompts";
  EXPECT_TRUE(clear) << "no clear winner found in 60 prompts";
}

TEST_F(TokenMatchTest, Bf16RefusesALengthDifferenceAndUnlikelySamples) {
  ctx_->tolerance = Tolerance::kBf16;
  const auto prompt = Prompt(6, 3);
  auto want = ctx_->reference->Greedy(prompt, 5);
  ASSERT_TRUE(want.ok()) << want.status();
  std::vector<int32_t> shorter(want->begin(), want->end() - 1);
  EXPECT_FALSE(SameGreedy(*ctx_, prompt, *want, shorter, "shorter").ok());
  auto rows = ctx_->reference->LogProbs(prompt, 1);
  ASSERT_TRUE(rows.ok()) << rows.status();
  const auto& lp = rows->back();
  const int32_t unlikely = static_cast<int32_t>(std::min_element(lp.begin(), lp.end()) - lp.begin());
  ASSERT_LT(lp[unlikely], std::log(kBf16MinSampledProb));
  ASSERT_LT(lp[unlikely], lp[(*want)[0]] - kBf16GreedyMargin);
  std::vector<int32_t> got = *want;
  got[0] = unlikely;
  EXPECT_FALSE(SameSampled(*ctx_, prompt, *want, got, "sampled").ok());
}

TEST(TokenMatch, ParsesTheFlag) {
  Tolerance t = Tolerance::kBf16;
  EXPECT_TRUE(ParseTolerance("", &t).ok());
  EXPECT_EQ(t, Tolerance::kExact);
  EXPECT_TRUE(ParseTolerance("bf16", &t).ok());
  EXPECT_EQ(t, Tolerance::kBf16);
  EXPECT_FALSE(ParseTolerance("fp8", &t).ok());
}

TEST(TokenMatch, LogprobToleranceFollowsTheMode) {
  Context ctx(ItestOptions{});
  EXPECT_FALSE(LogprobClose(ctx, -1.0, -1.01));
  ctx.tolerance = Tolerance::kBf16;
  EXPECT_TRUE(LogprobClose(ctx, -1.0, -1.3));
  EXPECT_TRUE(LogprobClose(ctx, -9.6, -10.0));
  EXPECT_FALSE(LogprobClose(ctx, -1.0, -1.6));
  EXPECT_FALSE(LogprobClose(ctx, -9.0, -10.0));
}

}  // namespace
}  // namespace moeshard::itest
