#include "worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "gtest/gtest.h"
#include "worker/fast_exp.h"

namespace moeshard {
namespace {

// V logits ~ N(0, scale) with a tie every `every` ids (l[i + 3] = l[i]).
std::vector<float> RowWithTies(int64_t V, float scale, int64_t every, std::mt19937& gen) {
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> l(V);
  for (auto& x : l) x = nd(gen);
  for (int64_t i = 0; i + 3 < V; i += every) l[i + 3] = l[i];
  return l;
}

// Seeded sampling parameters.
SamplingParams Seeded(float t, int top_k, float top_p, float min_p, uint64_t seed) {
  SamplingParams p;
  p.temperature = t;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seed = seed;
  p.has_seed = true;
  return p;
}

// The sampler sorts only the prefix that filters and draw reach; it must pick what the full
// sort picks, for every filter combination, peaked and flat rows, ties, small and large
// vocabularies (the normalizing sums differ in order only: ~1e-16, never a different token
// over these draws).
TEST(SamplerTest, MatchesTheFullSortDefinition) {
  std::mt19937 gen(12345);
  int checked = 0;
  for (int64_t V : {1, 3, 40, 300, 5000, 12000}) {
    for (float scale : {0.5f, 3.f, 12.f}) {  // flat to peaked
      std::normal_distribution<float> nd(0.f, scale);
      std::vector<float> l(V);
      for (auto& x : l) x = nd(gen);
      for (int64_t i = 0; i + 7 < V; i += 97) l[i + 7] = l[i];  // ties
      for (float t : {0.3f, 1.f, 2.f}) {
        for (int k : {0, 1, 5, 50}) {
          for (float top_p : {1.f, 0.9f, 0.5f}) {
            for (float min_p : {0.f, 0.05f, 0.3f}) {
              const SamplingParams p = Seeded(t, k, top_p, min_p, gen());
              Sampler s(p);
              for (int64_t pos : {0, 17}) {
                ASSERT_EQ(s.Sample(l.data(), V, pos), SampleByFullSort(l.data(), V, p, pos))
                    << "V " << V << " scale " << scale << " t " << t << " k " << k << " top_p " << top_p
                    << " min_p " << min_p << " pos " << pos;
                ++checked;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 6 * 3 * 3 * 4 * 3 * 3 * 2);
}

// ExpNonPositive (the normalizing sum's exp) against std::exp over [-708, 0]: a few ulp, and the
// floor below -708.
TEST(SamplerTest, ExpNonPositiveIsStdExp) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<double> wide(-708.0, 0.0), near(-1.0, 0.0);
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    const double x = i % 2 ? wide(gen) : near(gen);
    const double want = std::exp(x);
    worst = std::max(worst, std::abs(ExpNonPositive(x) - want) / want);
  }
  for (double x : {0.0, -1e-300, -0.5 * std::log(2.0), -std::log(2.0), -1.0, -700.0, -708.0}) {
    worst = std::max(worst, std::abs(ExpNonPositive(x) - std::exp(x)) / std::exp(x));
  }
  EXPECT_LE(worst, 8e-16);
  EXPECT_EQ(ExpNonPositive(0.0), 1.0);
  EXPECT_GT(ExpNonPositive(-1e6), 0.0);
  EXPECT_LT(ExpNonPositive(-1e6), 1e-300);
}

// Qwen3's vocabulary size (the bucketed draw, worker/sampler_buckets.h) against the definition:
// peaked to flat temperatures, with top-p and min-p, rows with ties.
TEST(SamplerTest, LargeVocabularyMatchesTheFullSortDefinition) {
  const int64_t V = 151936;
  std::mt19937 gen(77);
  const std::vector<float> l = RowWithTies(V, 3.f, 31, gen);
  int checked = 0;
  for (float t : {0.2f, 0.7f, 1.f, 1.7f}) {
    for (float top_p : {1.f, 0.95f, 0.5f}) {
      for (float min_p : {0.f, 0.02f}) {
        const SamplingParams p = Seeded(t, 0, top_p, min_p, gen());
        Sampler s(p);
        for (int64_t pos : {0, 5, 9}) {
          ASSERT_EQ(s.Sample(l.data(), V, pos), SampleByFullSort(l.data(), V, p, pos))
              << "t " << t << " top_p " << top_p << " min_p " << min_p << " pos " << pos;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 4 * 3 * 2 * 3);
}

// A row with NaNs (a broken model's logits): every setting draws an id of a real logit, on the
// prefix path (small vocabulary, top-k) and the bucketed one; never a crash.
TEST(SamplerTest, NaNLogitsNeverWin) {
  for (int64_t V : {int64_t{40}, int64_t{5000}}) {
    std::mt19937 gen(5);
    std::normal_distribution<float> nd(0.f, 2.f);
    std::vector<float> l(V);
    for (auto& x : l) x = nd(gen);
    for (int64_t i = 0; i < V; i += 3) l[i] = NAN;
    for (int k : {0, 5}) {
      for (float top_p : {1.f, 0.9f}) {
        Sampler s(Seeded(1.f, k, top_p, 0.f, 4));
        for (int64_t pos = 0; pos < 20; ++pos) {
          const int32_t id = s.Sample(l.data(), V, pos);
          ASSERT_TRUE(id >= 0 && id < V) << id;
          EXPECT_FALSE(std::isnan(l[id])) << "V " << V << " k " << k << " top_p " << top_p << " drew a NaN at " << id;
        }
      }
    }
  }
}

// A flat row (every logit equal) of a large vocabulary: the candidates past the first 256 come in
// id order as the full sort gives them, whatever the filter reaches.
TEST(SamplerTest, FlatRowsFollowTheIdOrder) {
  for (int64_t V : {int64_t{255}, int64_t{256}, int64_t{257}, int64_t{151936}}) {
    std::vector<float> l(V, 1.5f);
    for (float top_p : {1.f, 0.5f, 0.01f}) {
      const SamplingParams p = Seeded(1.f, 0, top_p, 0.f, 99);
      Sampler s(p);
      for (int64_t pos : {0, 1, 2, 3}) {
        ASSERT_EQ(s.Sample(l.data(), V, pos), SampleByFullSort(l.data(), V, p, pos)) << "V " << V << " top_p " << top_p;
      }
    }
  }
}

TEST(SamplerTest, GreedyIsArgmax) {
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 1.9f};
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.Sample(l.data(), 4), 1);
}

// ArgMax (two vectorized passes) against the scan it replaces: first index of the largest value,
// NaNs never winning (one at index 0 keeps 0), on lengths around the 8-lane blocks, with ties,
// infinities and NaNs sprinkled in.
TEST(SamplerTest, ArgMaxMatchesTheScan) {
  auto scan = [](const std::vector<float>& l) {
    int64_t best = 0;
    for (int64_t i = 1; i < static_cast<int64_t>(l.size()); ++i) {
      if (l[i] > l[best]) best = i;
    }
    return static_cast<int32_t>(best);
  };
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> small(-3, 3), kind(0, 19);
  int checked = 0;
  for (int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000, 151936}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> l(n);
      for (auto& x : l) {
        const int k = kind(rng);
        x = k == 0 ? NAN : k == 1 ? INFINITY : k == 2 ? -INFINITY : static_cast<float>(small(rng));  // many ties
      }
      if (trial % 4 == 0) l[0] = NAN;
      if (trial % 5 == 0) std::fill(l.begin(), l.end(), -INFINITY);
      ASSERT_EQ(ArgMax(l.data(), n), scan(l)) << "n " << n << " trial " << trial;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 13 * 40);
}

TEST(SamplerTest, SeededRunsRepeat) {
  std::vector<float> l = {0.5f, 0.4f, 0.3f, 0.2f, 0.1f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  p.has_seed = true;
  Sampler a(p), b(p);
  std::vector<int32_t> ra, rb;
  for (int i = 0; i < 50; ++i) {
    ra.push_back(a.Sample(l.data(), 5));
    rb.push_back(b.Sample(l.data(), 5));
  }
  EXPECT_EQ(ra, rb);
  std::map<int32_t, int> seen;
  for (auto t : ra) seen[t]++;
  EXPECT_GT(seen.size(), 1u) << "temperature 1 over near-equal logits must not always pick one token";
}

TEST(SamplerTest, FrequenciesFollowSoftmax) {
  std::vector<float> l = {1.0f, 0.0f, -1.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 7;
  p.has_seed = true;
  Sampler s(p);
  const int n = 20000;
  std::vector<int> count(3);
  for (int i = 0; i < n; ++i) count[s.Sample(l.data(), 3)]++;
  double z = std::exp(1.0) + 1.0 + std::exp(-1.0);
  double want[3] = {std::exp(1.0) / z, 1.0 / z, std::exp(-1.0) / z};
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(count[i] / double(n), want[i], 0.015) << i;
}

TEST(SamplerTest, FiltersKeepTheTop) {
  std::vector<float> l = {3.0f, 2.9f, 0.0f, -5.0f};
  for (int variant = 0; variant < 3; ++variant) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.has_seed = true;
    p.seed = variant;
    if (variant == 0) p.top_k = 1;
    if (variant == 1) p.top_p = 0.01f;
    if (variant == 2) p.min_p = 0.99f;
    Sampler s(p);
    for (int i = 0; i < 100; ++i) EXPECT_EQ(s.Sample(l.data(), 4), 0) << "variant " << variant;
  }
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  p.has_seed = true;
  Sampler s(p);
  for (int i = 0; i < 200; ++i) EXPECT_LT(s.Sample(l.data(), 4), 2);
}

TEST(SamplerTest, ValidateRejectsBadParams) {
  SamplingParams p;
  p.temperature = -1;
  EXPECT_FALSE(p.Validate().ok());
  p = SamplingParams{};
  p.top_p = 0;
  EXPECT_FALSE(p.Validate().ok());
  p = SamplingParams{};
  p.min_p = 1.5f;
  EXPECT_FALSE(p.Validate().ok());
  p = SamplingParams{};
  p.temperature = NAN;
  EXPECT_FALSE(p.Validate().ok());
  EXPECT_TRUE(SamplingParams{}.Validate().ok());
}

TEST(SamplerTest, LogProbs) {
  std::vector<float> l = {0.0f, std::log(3.0f)};
  EXPECT_NEAR(LogProb(l.data(), 2, 1), std::log(0.75), 1e-6);
  auto top = TopLogProbs(l.data(), 2, 1);
  ASSERT_EQ(top.size(), 1u);
  EXPECT_EQ(top[0].first, 1);
  EXPECT_TRUE(TopLogProbs(l.data(), 2, 0).empty());
  EXPECT_EQ(TopLogProbs(l.data(), 2, 5).size(), 2u);
}

// Logprobs over Qwen3's vocabulary against the plain definition (std::exp summed in id order, a
// full sort for the top 20, ties by id): the same ids, values within float rounding.
TEST(SamplerTest, LogProbsOfALargeVocabulary) {
  const int64_t V = 151936;
  std::mt19937 gen(8);
  const std::vector<float> l = RowWithTies(V, 4.f, 50, gen);
  double m = l[0];
  for (float x : l) m = std::max<double>(m, x);
  double sum = 0;
  for (float x : l) sum += std::exp(x - m);
  const double lse = m + std::log(sum);
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  const auto top = TopLogProbs(l.data(), V, 20);
  ASSERT_EQ(top.size(), 20u);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(top[i].first, order[i]) << i;
    EXPECT_NEAR(top[i].second, l[order[i]] - lse, 2e-6) << i;
  }
  for (int32_t id : {0, 1, 777, 151935}) EXPECT_NEAR(LogProb(l.data(), V, id), l[id] - lse, 2e-6) << id;
}

}  // namespace
}  // namespace moeshard
