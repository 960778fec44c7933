#include "worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/splitmix64.h"
#include "common/thread_pool.h"
#include "worker/fast_exp.h"
#include "worker/sampler_buckets.h"

namespace moeshard {

namespace {
// The RNG seed of the draw at `position` of a seeded request (splitmix64 of seed and position).
uint64_t PositionSeed(uint64_t seed, int64_t position) {
  return SplitMix64Mix(seed + kSplitMix64Gamma * static_cast<uint64_t>(position + 1));
}
}  // namespace

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.has_seed ? p.seed : std::random_device{}()) {}

// The first index of the largest value; NaNs never win (a NaN at 0 keeps 0, as a scan that
// only moves on a strictly larger value does). Two passes the compiler vectorizes (eight
// independent running maxima, then the first index equal to the maximum) instead of one
// scan whose every step depends on the last: the greedy token of a 151,936-entry row in a
// fraction of the scan's time.
int32_t ArgMax(const float* l, int64_t v) {
  if (v <= 1 || std::isnan(l[0])) return 0;
  constexpr int kLanes = 8;
  float mx[kLanes];
  for (int j = 0; j < kLanes; ++j) mx[j] = l[0];
  int64_t i = 0;
  for (; i + kLanes <= v; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) mx[j] = l[i + j] > mx[j] ? l[i + j] : mx[j];
  }
  float m = mx[0];
  for (int j = 1; j < kLanes; ++j) m = mx[j] > m ? mx[j] : m;
  for (; i < v; ++i) m = l[i] > m ? l[i] : m;
  for (int64_t k = 0; k < v; ++k) {
    if (l[k] == m) return static_cast<int32_t>(k);
  }
  return 0;  // unreachable: m is one of the values
}

namespace {

// sum of exp((l[i] - m) * inv_t) over i < v (m >= every l[i]): eight running sums, so that the
// loop vectorizes without reassociating one sum.
double ExpSum(const float* l, int64_t v, double m, double inv_t) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= v; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += ExpNonPositive((static_cast<double>(l[i + j]) - m) * inv_t);
  }
  for (; i < v; ++i) acc[0] += ExpNonPositive((static_cast<double>(l[i]) - m) * inv_t);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// The best g ids of [0, v) under `before` (a strict order: larger logit, then smaller id), best
// first: one pass keeping a heap of g whose worst is at its front; an id enters only when it beats
// that worst, which for a large vocabulary is rare after the first few thousand.
template <typename Cmp>
std::vector<int32_t> TopIds(int64_t v, int64_t g, Cmp before) {
  std::vector<int32_t> h;
  h.reserve(g);
  int64_t i = 0;
  for (; i < v && static_cast<int64_t>(h.size()) < g; ++i) {
    h.push_back(static_cast<int32_t>(i));
    std::push_heap(h.begin(), h.end(), before);
  }
  for (; i < v; ++i) {
    if (!before(static_cast<int32_t>(i), h.front())) continue;  // a tie never beats it: its id is smaller
    std::pop_heap(h.begin(), h.end(), before);
    h.back() = static_cast<int32_t>(i);
    std::push_heap(h.begin(), h.end(), before);
  }
  std::sort(h.begin(), h.end(), before);
  return h;
}

}  // namespace

// The smallest vocabulary the bucketed draw takes (below it sorting a prefix is as cheap).
constexpr int64_t kBucketedVocab = 2048;

int32_t Sampler::Sample(const float* logits, int64_t vocab, int64_t position) {
  if (p_.temperature <= 0.f) return ArgMax(logits, vocab);
  if (p_.has_seed && position >= 0) {
    rng_.seed(PositionSeed(p_.seed, position));
  }
  // Candidates in order of logit (descending), ties by id for reproducibility; everything is
  // what a full sort of the vocabulary would give (SampleByFullSort), without that sort
  // (~25 ms for 152K ids). A large vocabulary without top-k: bucketed by weight
  // (sampler_buckets.h). Otherwise only the prefix that the filters and the draw reach is
  // sorted, and the normalizing sum runs over every candidate in id order.
  const int64_t cand = p_.top_k > 0 && p_.top_k < vocab ? p_.top_k : vocab;  // the top-k candidates
  if (cand == vocab && vocab >= kBucketedVocab) {
    return SampleWholeVocabulary(logits, vocab, 1.0 / p_.temperature, p_.top_p, p_.min_p, rng_);
  }
  // NaN ranks as -inf, so the order is strict whatever the row holds (a sort under a comparator
  // that is not a strict order may run past its range).
  auto key = [&](int32_t a) { return logits[a] == logits[a] ? logits[a] : -std::numeric_limits<float>::infinity(); };
  auto cmp = [&](int32_t a, int32_t b) {
    const float ka = key(a), kb = key(b);
    return ka > kb || (ka == kb && a < b);
  };
  // idx[0, sorted) is the best `sorted` ids in order. The first 256 come from one heap pass
  // (TopIds); only a filter or draw that reaches past them makes idx every id (the rest after
  // the prefix) and grows the prefix 8x at a time by nth_element and a sort of the new part.
  std::vector<int32_t> idx;
  bool every_id = false;
  int64_t sorted = 0;
  auto ensure = [&](int64_t want) {  // idx[0, want) sorted, and no candidate outside beats them
    want = std::min(want, cand);
    if (want <= sorted) return;
    constexpr int64_t kFirst = 256;
    if (sorted == 0 && want <= kFirst) {
      idx = TopIds(vocab, std::min(kFirst, cand), cmp);
      sorted = static_cast<int64_t>(idx.size());
      return;
    }
    if (!every_id) {
      std::vector<char> in(vocab, 0);
      for (int64_t i = 0; i < sorted; ++i) in[idx[i]] = 1;
      idx.reserve(vocab);
      for (int64_t id = 0; id < vocab; ++id) {
        if (!in[id]) idx.push_back(static_cast<int32_t>(id));
      }
      every_id = true;
    }
    const int64_t grow = std::min(cand, std::max(want, sorted == 0 ? kFirst : sorted * 8));
    if (grow < vocab) std::nth_element(idx.begin() + sorted, idx.begin() + grow, idx.end(), cmp);
    std::sort(idx.begin() + sorted, idx.begin() + grow, cmp);
    sorted = grow;
  };
  ensure(1);
  const double inv_t = 1.0 / p_.temperature;
  const double m = logits[idx[0]];
  double sum = 0;
  if (cand == vocab) {
    sum = ExpSum(logits, vocab, m, inv_t);
  } else {
    ensure(cand);
    for (int64_t i = 0; i < cand; ++i) sum += std::exp((logits[idx[i]] - m) * inv_t);
  }
  std::vector<double> pr;  // probabilities of idx[0, pr.size())
  auto prob = [&](int64_t i) {
    while (static_cast<int64_t>(pr.size()) <= i) {
      ensure(static_cast<int64_t>(pr.size()) + 1);
      pr.push_back(std::exp((logits[idx[pr.size()]] - m) * inv_t) / sum);
    }
    return pr[i];
  };
  int64_t n = cand;  // candidates left after min-p and top-p
  if (p_.min_p > 0.f) {
    const double thr = p_.min_p * prob(0);
    int64_t j = 1;
    while (j < n && prob(j) >= thr) ++j;
    n = j;
  }
  if (p_.top_p < 1.f) {
    double c = 0;
    int64_t j = 0;
    while (j < n) {
      c += prob(j++);
      if (c >= p_.top_p) break;
    }
    n = std::max<int64_t>(j, 1);
  }
  // The draw over the first n candidates: their total mass, then a walk in order until the
  // running mass passes r (it ends early for any peaked distribution).
  double total = 0;
  if (n == vocab) {
    total = 1.0;  // every candidate: the normalized mass, without sorting them all
  } else {
    for (int64_t i = 0; i < n; ++i) total += prob(i);
  }
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng_), c = 0;
  for (int64_t i = 0; i < n; ++i) {
    c += prob(i);
    if (r < c) return idx[i];
  }
  return idx[n - 1];
}

// The definition the sampler implements, by a full sort of the vocabulary: candidates by
// logit (descending, ties by id), top-k, softmax at the temperature, min-p, top-p, then a
// draw of u(0, mass kept) walked in order. The same seeded RNG stream as Sampler.
int32_t SampleByFullSort(const float* l, int64_t V, const SamplingParams& p, int64_t position) {
  std::mt19937_64 rng(PositionSeed(p.seed, position));
  std::vector<int32_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  if (p.temperature <= 0.f) return idx[0];  // greedy: the first of the order (ties by id)
  if (p.top_k > 0 && p.top_k < V) idx.resize(p.top_k);
  const double m = l[idx[0]];
  std::vector<double> pr(idx.size());
  double sum = 0;
  for (size_t i = 0; i < idx.size(); ++i) sum += (pr[i] = std::exp((l[idx[i]] - m) / p.temperature));
  for (auto& x : pr) x /= sum;
  size_t n = pr.size();
  if (p.min_p > 0.f) {
    size_t j = 1;
    while (j < n && pr[j] >= p.min_p * pr[0]) ++j;
    n = j;
  }
  if (p.top_p < 1.f) {
    double c = 0;
    size_t j = 0;
    while (j < n) {
      c += pr[j++];
      if (c >= p.top_p) break;
    }
    n = std::max<size_t>(j, 1);
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += pr[i];
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng), c = 0;
  for (size_t i = 0; i < n; ++i) {
    c += pr[i];
    if (r < c) return idx[i];
  }
  return idx[n - 1];
}

// log(sum exp(l)) in double: the vectorized sum of exp(l - max) (ExpSum).
static double LogSumExp(const float* l, int64_t v) {
  const double m = l[ArgMax(l, v)];
  return m + std::log(ExpSum(l, v, m, 1.0));
}

float LogProb(const float* l, int64_t v, int32_t id) { return static_cast<float>(l[id] - LogSumExp(l, v)); }

// The n best ids by one heap pass (TopIds; NaN ranks last), with their logprobs given the row's lse.
static std::vector<std::pair<int32_t, float>> TopLogProbsWith(const float* l, int64_t v, int n, double lse) {
  n = static_cast<int>(std::min<int64_t>(n, v));
  std::vector<std::pair<int32_t, float>> out;
  if (n <= 0) return out;
  auto key = [&](int32_t a) { return l[a] == l[a] ? l[a] : -std::numeric_limits<float>::infinity(); };
  const std::vector<int32_t> idx = TopIds(v, n, [&](int32_t a, int32_t b) {
    const float ka = key(a), kb = key(b);
    return ka > kb || (ka == kb && a < b);
  });
  for (int i = 0; i < n; ++i) out.push_back({idx[i], static_cast<float>(l[idx[i]] - lse)});
  return out;
}

std::vector<std::pair<int32_t, float>> TopLogProbs(const float* l, int64_t v, int n) {
  return TopLogProbsWith(l, v, n, LogSumExp(l, v));
}

std::vector<RowSample> SamplerSet::Sample(const std::vector<RowDraw>& rows, const float* logits, int64_t vocab) {
  std::vector<Sampler*> samplers;
  for (const RowDraw& r : rows) {
    auto it = samplers_.find(r.seq_id);
    if (it == samplers_.end()) it = samplers_.emplace(r.seq_id, Sampler(r.sampling)).first;
    samplers.push_back(&it->second);
  }
  std::vector<RowSample> out(rows.size());
  ThreadPool::Default().ParallelFor(static_cast<int64_t>(rows.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const RowDraw& r = rows[i];
      const float* row = logits + r.row * vocab;
      out[i].token = samplers[i]->Sample(row, vocab, r.position);
      if (r.logprobs || r.top_logprobs > 0) {
        const double lse = LogSumExp(row, vocab);  // once for both
        out[i].logprob = static_cast<float>(row[out[i].token] - lse);
        if (r.top_logprobs > 0) out[i].top = TopLogProbsWith(row, vocab, std::min(r.top_logprobs, 20), lse);
      }
    }
  });
  return out;
}

}  // namespace moeshard
