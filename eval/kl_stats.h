// How one run's next-token distributions differ from a base run's, position by position:
// KL(base || run), top-1 agreement ("same top p"), the change of the probability of the
// actual next token (Δp) and both perplexities, as llama.cpp's llama-perplexity reports them
// with --kl-divergence (mean ± standard error of the mean, max, percentiles).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moeshard {

// log(sum(exp(l))) in double, and out[i] = l[i] - that.
double LogSumExp(const float* l, int64_t n);
void LogSoftmax(const float* l, int64_t n, float* out);
// The first index of the largest value.
int64_t Argmax(const float* l, int64_t n);

// Accumulates positions. Not thread-safe.
class KlStats {
 public:
  // `base` and `run`: log-probabilities [vocab] of one position; `next_id` the token that
  // follows it. Terms whose base log-probability is at or below `base_floor` are left out
  // of the KL sum (llama-perplexity's -16 for its quantized files).
  void Add(const float* base, const float* run, int64_t vocab, int32_t next_id, float base_floor);
  // The same from raw logits (any shift), all in double: for comparisons finer than the
  // float rounding of stored log-probabilities (~1e-8 of KL).
  void AddLogits(const float* base, const float* run, int64_t vocab, int32_t next_id);

  int64_t count() const { return count_; }
  double mean_kl() const { return count_ ? sum_kl_ / count_ : 0; }
  double max_kl() const { return count_ ? max_kl_ : 0; }
  double top1() const { return count_ ? static_cast<double>(same_top_) / count_ : 0; }
  double ppl() const;
  double base_ppl() const;
  // A first line `compare: base perplexity P, this run Q; KL(base||run) mean M max X; top-1
  // agreement A %`, then llama-perplexity's figures with their uncertainties.
  std::string Format() const;

 private:
  void Accumulate(double kl, bool same_top, double nll, double nll_base);

  int64_t count_ = 0, same_top_ = 0;
  double sum_nll_ = 0, sum_nll2_ = 0, sum_nll_base_ = 0, sum_nll_base2_ = 0;
  double sum_kl_ = 0, sum_kl2_ = 0, max_kl_ = -1e300;
  double sum_dp_ = 0, sum_dp2_ = 0, sum_dp4_ = 0, max_abs_dp_ = 0;
  std::vector<float> kls_;
};

}  // namespace moeshard
