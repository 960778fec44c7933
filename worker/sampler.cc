#include "worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace moeshard {

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0.f) || temperature > 100.f || std::isnan(temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be in [0, 100], got ", temperature));
  }
  if (top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", top_k));
  if (!(top_p > 0.f && top_p <= 1.f)) return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  if (!(min_p >= 0.f && min_p <= 1.f)) return absl::InvalidArgumentError(absl::StrCat("min_p must be in [0, 1], got ", min_p));
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.has_seed ? p.seed : std::random_device{}()) {}

int32_t ArgMax(const float* l, int64_t v) {
  int64_t best = 0;
  for (int64_t i = 1; i < v; ++i) {
    if (l[i] > l[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

int32_t Sampler::Sample(const float* logits, int64_t vocab, int64_t position) {
  if (p_.temperature <= 0.f) return ArgMax(logits, vocab);
  if (p_.has_seed && position >= 0) {
    uint64_t z = p_.seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(position + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    rng_.seed(z ^ (z >> 31));
  }
  // Candidates sorted by logit (descending), ties by id for reproducibility.
  std::vector<int32_t> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  int64_t keep = vocab;
  if (p_.top_k > 0 && p_.top_k < vocab) keep = p_.top_k;
  auto cmp = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (keep < vocab) {
    std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), cmp);
    idx.resize(keep);
  } else {
    std::sort(idx.begin(), idx.end(), cmp);
  }
  const double inv_t = 1.0 / p_.temperature;
  const double m = logits[idx[0]];
  std::vector<double> pr(idx.size());
  double sum = 0;
  for (size_t i = 0; i < idx.size(); ++i) sum += (pr[i] = std::exp((logits[idx[i]] - m) * inv_t));
  for (auto& x : pr) x /= sum;
  size_t n = pr.size();
  if (p_.min_p > 0.f) {
    double thr = p_.min_p * pr[0];
    size_t j = 1;
    while (j < n && pr[j] >= thr) ++j;
    n = j;
  }
  if (p_.top_p < 1.f) {
    double c = 0;
    size_t j = 0;
    while (j < n) {
      c += pr[j++];
      if (c >= p_.top_p) break;
    }
    n = std::max<size_t>(j, 1);
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += pr[i];
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng_), c = 0;
  for (size_t i = 0; i < n; ++i) {
    c += pr[i];
    if (r < c) return idx[i];
  }
  return idx[n - 1];
}

static double LogSumExp(const float* l, int64_t v) {
  double m = l[ArgMax(l, v)], s = 0;
  for (int64_t i = 0; i < v; ++i) s += std::exp(l[i] - m);
  return m + std::log(s);
}

float LogProb(const float* l, int64_t v, int32_t id) { return static_cast<float>(l[id] - LogSumExp(l, v)); }

std::vector<std::pair<int32_t, float>> TopLogProbs(const float* l, int64_t v, int n) {
  n = static_cast<int>(std::min<int64_t>(n, v));
  std::vector<int32_t> idx(v);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                    [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  double lse = LogSumExp(l, v);
  std::vector<std::pair<int32_t, float>> out;
  for (int i = 0; i < n; ++i) out.push_back({idx[i], static_cast<float>(l[idx[i]] - lse)});
  return out;
}

}  // namespace moeshard
