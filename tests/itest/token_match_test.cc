// itest's token comparison (tests/itest/token_match.h) against the in-process float32 engine on
// a real test model: exact mode refuses any difference; the bf16 tolerance accepts a parting
// only at a near tie of the float32 engine and names the position and both log-probabilities
// otherwise.
#include "tests/itest/token_match.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "tests/itest/client.h"
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
  // A test that stops at a failed assertion leaves the suite's context as the next one expects.
  void SetUp() override {
    ctx_->tolerance = Tolerance::kExact;
    ctx_->route_tie_bound = kBf16RouteTie;
    ctx_->route_ties_tried = kRouteTiesTried;
  }
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
  ctx_->route_tie_bound = -1;  // the final logits' rule alone (the router ties: below)
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

// The pick's boundary: the k-th and (k+1)-th logits, equal ones the lower expert first.
TEST(TokenMatch, TopKBoundaryIsThePicksLastAndTheFirstLeftOut) {
  const float row[6] = {0.5f, 3.f, 1.f, 2.f, 1.f, -4.f};
  RouteTie t = TopKBoundary(row, 6, 2);
  EXPECT_EQ(t.picked, 3);
  EXPECT_EQ(t.next, 2);  // 1.0 at experts 2 and 4: the lower first
  EXPECT_DOUBLE_EQ(t.margin, 1.0);
  t = TopKBoundary(row, 6, 3);
  EXPECT_EQ(t.picked, 2);
  EXPECT_EQ(t.next, 4);
  EXPECT_DOUBLE_EQ(t.margin, 0.0);
  t = TopKBoundary(row, 6, 1);
  EXPECT_EQ(t.picked, 1);
  EXPECT_EQ(t.next, 3);
  EXPECT_DOUBLE_EQ(t.margin, 1.0);
}

// With the suite's bounds, a token the float32 engine finds least likely is refused wherever it is.
TEST_F(TokenMatchTest, Bf16DefaultsRefuseAnUnlikelyLaterToken) {
  ctx_->tolerance = Tolerance::kBf16;
  for (int seed : {3, 11}) {
    const auto prompt = Prompt(8, seed);
    auto want = ctx_->reference->Greedy(prompt, 6);
    ASSERT_TRUE(want.ok()) << want.status();
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), want->begin(), want->begin() + 4);
    auto rows = ctx_->reference->LogProbs(seq, 1);
    ASSERT_TRUE(rows.ok());
    const auto& lp = rows->back();
    std::vector<int32_t> got = *want;
    got[4] = static_cast<int32_t>(std::min_element(lp.begin(), lp.end()) - lp.begin());
    ASSERT_GT(lp[(*want)[4]] - lp[got[4]], kBf16GreedyMargin);
    const absl::Status st = SameGreedy(*ctx_, prompt, *want, got, "unlikely");
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("at position 4"), std::string::npos) << st;
  }
}

// The router's ties: the nearest first, each a pick and the expert just left out; a run with
// one decided the other way keeps every row before its position and changes one from there on.
TEST_F(TokenMatchTest, RouteTiesAreTheRoutersAndASwapActsFromItsPosition) {
  const auto seq = Prompt(10, 2);
  const ModelConfig& c = ctx_->reference->config();
  auto ties = ctx_->reference->RouteTies(seq, 10, 1000);
  ASSERT_TRUE(ties.ok()) << ties.status();
  int64_t moe_layers = 0;
  for (const auto& l : c.layers) moe_layers += l.moe ? 1 : 0;
  ASSERT_GT(moe_layers, 0);
  ASSERT_EQ(static_cast<int64_t>(ties->size()), std::min<int64_t>(1000, 10 * moe_layers));
  for (size_t i = 0; i < ties->size(); ++i) {
    const RouteTie& t = (*ties)[i];
    EXPECT_GE(t.margin, 0.0);
    if (i > 0) EXPECT_LE((*ties)[i - 1].margin, t.margin);
    EXPECT_NE(t.picked, t.next);
    EXPECT_LT(t.picked, c.num_experts);
    EXPECT_LT(t.next, c.num_experts);
    EXPECT_LT(t.position, 10);
    EXPECT_TRUE(c.layers[t.layer].moe) << t.layer;
  }
  auto first4 = ctx_->reference->RouteTies(seq, 4, 1000);
  ASSERT_TRUE(first4.ok()) << first4.status();
  EXPECT_EQ(static_cast<int64_t>(first4->size()), 4 * moe_layers);
  for (const RouteTie& t : *first4) EXPECT_LT(t.position, 4);
  EXPECT_FALSE(ctx_->reference->RouteTies(seq, 0, 1).ok());
  EXPECT_FALSE(ctx_->reference->RouteTies(seq, 11, 1).ok());

  // The nearest tie past position 0, decided the other way.
  const RouteTie* t = nullptr;
  for (const RouteTie& x : *ties) {
    if (x.position > 0) {
      t = &x;
      break;
    }
  }
  ASSERT_NE(t, nullptr);
  auto base = ctx_->reference->LogProbs(seq, 10);
  auto alt = ctx_->reference->LogProbs(seq, 10, t);
  ASSERT_TRUE(base.ok() && alt.ok());
  for (int64_t p = 0; p < t->position; ++p) EXPECT_EQ((*base)[p], (*alt)[p]) << "row " << p;
  double moved = 0;
  for (int64_t p = t->position; p < 10; ++p) {
    for (size_t v = 0; v < (*base)[p].size(); ++v) moved = std::max(moved, std::fabs((*base)[p][v] - (*alt)[p][v]));
  }
  EXPECT_GT(moved, 1e-6) << DescribeTie(*t);
  // Afterwards the engine runs unswapped again.
  auto again = ctx_->reference->LogProbs(seq, 10);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *base);
  RouteTie bad = *t;
  bad.next = bad.picked;
  EXPECT_FALSE(ctx_->reference->LogProbs(seq, 10, &bad).ok());
  EXPECT_FALSE(ctx_->reference->Greedy(seq, 2, &bad).ok());
}

// A bf16 run whose tokens part from float32's where the final logits are far apart is accepted
// when the float32 engine, run with a router tie up to there decided the other way, gives those
// tokens; and a later token that run does not give (far from its best) is refused. On this random
// model one expert swapped moves the next token's logits little: the case is found among all the
// ties, so every tie is tried here (the suite tries the nearest few; with many tried, some routing
// explains almost any parting, which is why it tries few and close ones).
TEST_F(TokenMatchTest, Bf16AcceptsAPartingARouterTieExplains) {
  ctx_->tolerance = Tolerance::kBf16;
  constexpr int64_t kN = 8;
  // The search starts where it found its case in a Release build (seed 11: layer 0, position 0,
  // experts 11 / 4, margin 0.21) and goes on should a build compute otherwise.
  constexpr int kFirstSeed = 11;
  bool found = false;
  for (int seed = kFirstSeed; seed < kFirstSeed + 40 && !found; ++seed) {
    const auto prompt = Prompt(6 + seed % 5, seed + 100);
    auto want = ctx_->reference->Greedy(prompt, kN);
    ASSERT_TRUE(want.ok()) << want.status();
    auto ties = ctx_->reference->RouteTies(prompt, static_cast<int64_t>(prompt.size()), 1000);
    ASSERT_TRUE(ties.ok()) << ties.status();
    for (const RouteTie& t : *ties) {
      auto got = ctx_->reference->Greedy(prompt, kN, &t);
      ASSERT_TRUE(got.ok()) << got.status();
      if (*got == *want) continue;
      ctx_->route_tie_bound = -1;  // no tie: the final logits alone must explain it
      if (SameGreedy(*ctx_, prompt, *want, *got, "no tie").ok()) continue;
      ctx_->route_tie_bound = 1e9;
      ctx_->route_ties_tried = 1000;
      const absl::Status st = SameGreedy(*ctx_, prompt, *want, *got, "tie");
      EXPECT_TRUE(st.ok()) << DescribeTie(t) << ": " << st;
      // A token after the parting that neither run gives, where the swapped run's is clear.
      size_t i = 0;
      while ((*want)[i] == (*got)[i]) ++i;
      bool refused = false;
      for (size_t j = i + 1; j < got->size() && !refused; ++j) {
        std::vector<int32_t> seq = prompt;
        seq.insert(seq.end(), got->begin(), got->begin() + j);
        auto rows = ctx_->reference->LogProbs(seq, 1, &t);
        ASSERT_TRUE(rows.ok());
        const auto& lp = rows->back();
        const int32_t worst = static_cast<int32_t>(std::min_element(lp.begin(), lp.end()) - lp.begin());
        if (lp[(*got)[j]] - lp[worst] <= kBf16GreedyMargin) continue;
        std::vector<int32_t> wrong = *got;
        wrong[j] = worst;
        const absl::Status w = SameGreedyUnder(*ctx_, prompt, t, wrong, "wrong", static_cast<int64_t>(i));
        EXPECT_FALSE(w.ok()) << "position " << j;
        EXPECT_NE(w.message().find(absl::StrCat("at position ", j)), std::string::npos) << w;
        EXPECT_TRUE(SameGreedyUnder(*ctx_, prompt, t, *got, "tie", static_cast<int64_t>(i)).ok());
        refused = true;
      }
      EXPECT_TRUE(refused) << "no clear token after the parting";
      // With every tie tried, a token after the parting that the float32 engine finds least likely,
      // on its own tokens, is still refused: a tie whose run parts from them earlier excuses nothing.
      std::vector<int32_t> late = *want;
      std::vector<int32_t> s3 = prompt;
      s3.insert(s3.end(), want->begin(), want->end() - 1);
      auto rows = ctx_->reference->LogProbs(s3, 1);
      ASSERT_TRUE(rows.ok());
      late.back() =
          static_cast<int32_t>(std::min_element(rows->back().begin(), rows->back().end()) - rows->back().begin());
      EXPECT_FALSE(SameGreedy(*ctx_, prompt, *want, late, "late").ok()) << "seed " << seed;
      found = true;
      break;
    }
  }
  EXPECT_TRUE(found) << "no router tie in 40 prompts changed the greedy tokens past the final-logit margin";
}

// The same for logprobs: the float32 engine's values with a router tie decided the other way are
// accepted where they differ by more than the bf16 bound; one value off by more fails.
TEST_F(TokenMatchTest, Bf16LogprobsARouterTieExplains) {
  ctx_->tolerance = Tolerance::kBf16;
  constexpr int64_t kN = 6;
  constexpr size_t kTop = 3;
  // Found in a Release build at seed 20 (layer 0, position 5, experts 9 / 13, margin 0.041).
  constexpr int kFirstSeed = 20;
  bool found = false;
  for (int seed = kFirstSeed; seed < kFirstSeed + 40 && !found; ++seed) {
    const auto prompt = Prompt(6 + seed % 5, seed + 300);
    auto tokens = ctx_->reference->Greedy(prompt, kN);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), tokens->begin(), tokens->end() - 1);
    auto ties = ctx_->reference->RouteTies(seq, static_cast<int64_t>(prompt.size()), kRouteTiesTried);
    ASSERT_TRUE(ties.ok()) << ties.status();
    for (const RouteTie& t : *ties) {
      auto alt = ctx_->reference->LogProbs(seq, kN, &t);
      ASSERT_TRUE(alt.ok()) << alt.status();
      ServedLogprobs s;
      s.prompt = prompt;
      s.tokens = *tokens;
      for (int64_t i = 0; i < kN; ++i) {
        const auto& lp = (*alt)[i];
        s.chosen.push_back(lp[(*tokens)[i]]);
        std::vector<double> top = lp;
        std::partial_sort(top.begin(), top.begin() + kTop, top.end(), std::greater<>());
        top.resize(kTop);
        s.top.push_back(top);
      }
      ctx_->route_tie_bound = -1;
      if (SameLogprobs(*ctx_, s).ok()) continue;  // within the bf16 bound without the tie
      ctx_->route_tie_bound = 1e9;
      // Ties nearer than t up to the first differing position may explain it too; t itself must be
      // among those tried for the case to count.
      const absl::Status st = SameLogprobs(*ctx_, s);
      if (!st.ok() && st.message().find(DescribeTie(t)) == std::string::npos) continue;
      EXPECT_TRUE(st.ok()) << DescribeTie(t) << ": " << st;
      ServedLogprobs off = s;
      off.top.back().back() -= 1.0;  // the last position's last alternative off by 1 nat
      const absl::Status w = SameLogprobs(*ctx_, off);
      EXPECT_FALSE(w.ok());
      EXPECT_NE(w.message().find("router ties decided the other way"), std::string::npos) << w;
      found = true;
      break;
    }
  }
  EXPECT_TRUE(found) << "no router tie in 40 prompts moved a logprob past the bf16 bound";
}

// What the GPU lane saw from the bundled demo model's bf16 TP 2 cluster on every H100 and H200 run
// since 66b6317 (the suite's greedy check, prompt length 33: MakePrompt(33, 108, vocab), 10
// tokens): it parts from the float32 engine at index 3, where float32's margin is 1.86 nats — the
// bf16 run picked another expert at a router near tie inside the model. The final logits' rule
// refuses it; the router-tie rule, at the suite's bounds, accepts it.
TEST(TokenMatchDemo, Bf16DemoTp2RouterTieExplains) {
  auto r = ReferenceEngine::Load(std::string(MOESHARD_SOURCE_DIR) + "/models/muse-spark-demo");
  ASSERT_TRUE(r.ok()) << r.status();
  Context ctx{ItestOptions{}};
  ctx.reference = *std::move(r);
  ASSERT_NE(ctx.reference->tokenizer(), nullptr);
  const int64_t vocab = std::min<int64_t>(ctx.reference->config().vocab_size,
                                          ctx.reference->tokenizer()->vocab_size());  // as checks_setup.cc
  const auto prompt = MakePrompt(33, 108, vocab);
  auto want = ctx.reference->Greedy(prompt, 10);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(*want, (std::vector<int32_t>{261, 411, 271, 354, 438, 286, 1412, 14, 261, 411}));
  const std::vector<int32_t> served = {261, 411, 271, 306, 3862, 81, 261, 411, 271, 306};
  ctx.tolerance = Tolerance::kBf16;
  ctx.route_tie_bound = -1;
  const absl::Status final_only = SameGreedy(ctx, prompt, *want, served, "demo-tp2");
  EXPECT_FALSE(final_only.ok());
  EXPECT_NE(final_only.message().find("outside the bf16 greedy margin"), std::string::npos) << final_only;
  ctx.route_tie_bound = kBf16RouteTie;
  EXPECT_TRUE(SameGreedy(ctx, prompt, *want, served, "demo-tp2").ok());
  // The same with a later token changed (index 6 to token 3) is refused.
  std::vector<int32_t> wrong = served;
  wrong[6] = 3;
  EXPECT_FALSE(SameGreedy(ctx, prompt, *want, wrong, "demo-tp2 wrong").ok());
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
