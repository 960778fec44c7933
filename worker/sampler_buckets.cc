#include "worker/sampler_buckets.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "worker/fast_exp.h"

namespace moeshard {
namespace {

constexpr int kBuckets = 4096;
constexpr double kSpan = 48.0;  // x = (max - l) / t in [0, kSpan) over the buckets; the rest in the last

// Per thread (SamplerSet draws rows on several threads): weights, buckets, ids by bucket.
struct Scratch {
  std::vector<double> w;
  std::vector<uint16_t> bucket;
  std::vector<int32_t> order;
  std::vector<int32_t> count, start;
  std::vector<double> mass;
  std::vector<char> sorted;
};

// Walks the candidates in the definition's order (logit descending, ties by id) bucket by bucket,
// sorting a bucket only when the walk has to look inside it.
class Walk {
 public:
  Walk(const float* l, Scratch& s, double sum) : l_(l), s_(s), inv_sum_(1.0 / sum) {}
  // Sorted ids of bucket b (gathered and sorted on first use: a walk looks inside a few buckets).
  const int32_t* Bucket(int b) {
    int32_t* first = s_.order.data() + s_.start[b];
    if (!s_.sorted[b]) {
      int32_t* at = first;
      const uint16_t* bucket = s_.bucket.data();
      const int64_t v = static_cast<int64_t>(s_.bucket.size());
      for (int64_t i = 0; i < v; ++i) {
        if (bucket[i] == b) *at++ = static_cast<int32_t>(i);
      }
      // NaN as -inf: a strict order whatever the row holds (NaN weighs ~0 and sits in the last bucket).
      auto key = [&](int32_t a) { return l_[a] == l_[a] ? l_[a] : -std::numeric_limits<float>::infinity(); };
      std::sort(first, first + s_.count[b], [&](int32_t a, int32_t c) {
        const float ka = key(a), kc = key(c);
        return ka > kc || (ka == kc && a < c);
      });
      s_.sorted[b] = 1;
    }
    return first;
  }
  double Prob(int32_t id) const { return s_.w[id] * inv_sum_; }
  double BucketProb(int b) const { return s_.mass[b] * inv_sum_; }

 private:
  const float* l_;
  Scratch& s_;
  double inv_sum_;
};

}  // namespace

int32_t SampleWholeVocabulary(const float* l, int64_t vocab, double inv_t, float top_p, float min_p,
                              std::mt19937_64& rng) {
  thread_local Scratch s;
  // The largest logit that is a number (NaNs weigh ~e^-708 and sort last; ArgMax would keep a
  // NaN at index 0).
  float mx[8];
  for (float& x : mx) x = -std::numeric_limits<float>::infinity();
  int64_t i0 = 0;
  for (; i0 + 8 <= vocab; i0 += 8) {
    for (int j = 0; j < 8; ++j) mx[j] = l[i0 + j] > mx[j] ? l[i0 + j] : mx[j];
  }
  for (; i0 < vocab; ++i0) mx[0] = l[i0] > mx[0] ? l[i0] : mx[0];
  double m = mx[0];
  for (float x : mx) m = x > m ? x : m;
  s.w.resize(vocab);
  s.bucket.resize(vocab);
  const double scale = (kBuckets - 1) / kSpan;
  // One vectorizable pass: each id's weight and bucket (NaN and -inf weigh ~e^-708, last bucket).
  double* w = s.w.data();
  uint16_t* bucket = s.bucket.data();
  for (int64_t i = 0; i < vocab; ++i) {
    double x = (static_cast<double>(l[i]) - m) * inv_t;
    x = x >= -708.0 ? x : -708.0;  // NaN too
    w[i] = ExpNonPositive(x);
    bucket[i] = static_cast<uint16_t>(static_cast<int32_t>(std::min(-x * scale, double{kBuckets - 1})));
  }
  s.count.assign(kBuckets, 0);
  s.mass.assign(kBuckets, 0.0);
  int64_t kept = 0;  // min-p: ids with w >= min_p, which are the order's first `kept`
  for (int64_t i = 0; i < vocab; ++i) {
    ++s.count[s.bucket[i]];
    s.mass[s.bucket[i]] += s.w[i];
    kept += s.w[i] >= min_p ? 1 : 0;
  }
  s.start.resize(kBuckets + 1);
  s.start[0] = 0;
  for (int b = 0; b < kBuckets; ++b) s.start[b + 1] = s.start[b] + s.count[b];
  s.order.resize(vocab);  // filled bucket by bucket as the walks enter them
  s.sorted.assign(kBuckets, 0);
  double sum = 0;
  for (int b = 0; b < kBuckets; ++b) sum += s.mass[b];
  Walk walk(l, s, sum);

  int64_t n = vocab;  // candidates left after min-p and top-p
  if (min_p > 0.f) n = std::max<int64_t>(kept, 1);
  if (top_p < 1.f) {  // the first j whose running probability reaches top_p
    double c = 0;
    int64_t j = 0;
    bool reached = false;
    for (int b = 0; b < kBuckets && j < n && !reached; ++b) {
      if (j + s.count[b] <= n && c + walk.BucketProb(b) < top_p) {
        c += walk.BucketProb(b);
        j += s.count[b];
        continue;
      }
      const int32_t* ids = walk.Bucket(b);
      for (int32_t k = 0; k < s.count[b] && j < n; ++k) {
        c += walk.Prob(ids[k]);
        ++j;
        if (c >= top_p) {
          reached = true;
          break;
        }
      }
    }
    n = std::max<int64_t>(j, 1);
  }
  // The mass of the first n, then the draw walked in order.
  double total = 0;
  if (n == vocab) {
    total = 1.0;
  } else {
    int64_t j = 0;
    for (int b = 0; b < kBuckets && j < n; ++b) {
      if (j + s.count[b] <= n) {
        total += walk.BucketProb(b);
        j += s.count[b];
        continue;
      }
      const int32_t* ids = walk.Bucket(b);
      for (int32_t k = 0; j < n; ++k, ++j) total += walk.Prob(ids[k]);
    }
  }
  std::uniform_real_distribution<double> u(0.0, total);
  const double r = u(rng);
  double c = 0;
  int64_t j = 0;
  int32_t last = -1;  // the order's candidate n - 1, if the walk got there
  for (int b = 0; b < kBuckets && j < n; ++b) {
    if (j + s.count[b] < n && c + walk.BucketProb(b) <= r) {
      c += walk.BucketProb(b);
      j += s.count[b];
      continue;
    }
    const int32_t* ids = walk.Bucket(b);
    for (int32_t k = 0; k < s.count[b] && j < n; ++k, ++j) {
      c += walk.Prob(ids[k]);
      if (r < c) return ids[k];
      last = ids[k];
    }
  }
  return last;  // rounding left r past the running sum: the last kept candidate (as the definition)
}

}  // namespace moeshard
