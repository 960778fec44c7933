#include "eval/kl_stats.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_format.h"

namespace moeshard {
namespace {

// Mean and standard error of the mean from a sum and a sum of squares.
std::pair<double, double> MeanAndError(double sum, double sum2, int64_t n) {
  if (n < 1) return {0, 0};
  const double mean = sum / n, var = sum2 / n - mean * mean;
  return {mean, var > 0 && n > 10 ? std::sqrt(var / (n - 1)) : 0};
}

// Linear interpolation between the sorted values around `fraction`.
double Percentile(const std::vector<float>& sorted, double fraction) {
  const double p = fraction * (sorted.size() - 1);
  const size_t i = static_cast<size_t>(p);
  const size_t j = std::min(i + 1, sorted.size() - 1);
  return (1 - (p - i)) * sorted[i] + (p - i) * sorted[j];
}

}  // namespace

double LogSumExp(const float* l, int64_t n) {
  double m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max<double>(m, l[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(l[i] - m);
  return m + std::log(s);
}

void LogSoftmax(const float* l, int64_t n, float* out) {
  const double lse = LogSumExp(l, n);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(l[i] - lse);
}

int64_t Argmax(const float* l, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (l[i] > l[b]) b = i;
  }
  return b;
}

void KlStats::Add(const float* base, const float* run, int64_t vocab, int32_t next_id, float base_floor) {
  double kl = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (base[i] > base_floor) kl += std::exp(static_cast<double>(base[i])) * (base[i] - run[i]);
  }
  Accumulate(kl, Argmax(base, vocab) == Argmax(run, vocab), -run[next_id], -base[next_id]);
}

void KlStats::AddLogits(const float* base, const float* run, int64_t vocab, int32_t next_id) {
  const double lse_base = LogSumExp(base, vocab), lse_run = LogSumExp(run, vocab);
  double kl = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const double b = base[i] - lse_base;
    kl += std::exp(b) * (b - (run[i] - lse_run));
  }
  Accumulate(kl, Argmax(base, vocab) == Argmax(run, vocab), lse_run - run[next_id], lse_base - base[next_id]);
}

void KlStats::Accumulate(double kl, bool same_top, double nll, double nll_base) {
  ++count_;
  sum_kl_ += kl;
  sum_kl2_ += kl * kl;
  max_kl_ = std::max(max_kl_, kl);
  kls_.push_back(static_cast<float>(kl));
  same_top_ += same_top;
  sum_nll_ += nll;
  sum_nll2_ += nll * nll;
  sum_nll_base_ += nll_base;
  sum_nll_base2_ += nll_base * nll_base;
  const double dp = std::exp(-nll) - std::exp(-nll_base);
  sum_dp_ += dp;
  sum_dp2_ += dp * dp;
  sum_dp4_ += dp * dp * dp * dp;
  max_abs_dp_ = std::max(max_abs_dp_, std::fabs(dp));
}

double KlStats::ppl() const { return count_ ? std::exp(sum_nll_ / count_) : 0; }
double KlStats::base_ppl() const { return count_ ? std::exp(sum_nll_base_ / count_) : 0; }

std::string KlStats::Format() const {
  std::string out = absl::StrFormat(
      "compare: base perplexity %.4f, this run %.4f; KL(base||run) mean %.3g max %.3g; top-1 agreement %.2f %%\n",
      base_ppl(), ppl(), mean_kl(), max_kl(), 100 * top1());
  if (count_ == 0) return out;
  auto [lp, lp_err] = MeanAndError(sum_nll_, sum_nll2_, count_);
  auto [lpb, lpb_err] = MeanAndError(sum_nll_base_, sum_nll_base2_, count_);
  auto [kl, kl_err] = MeanAndError(sum_kl_, sum_kl2_, count_);
  auto [dp2, dp2_err] = MeanAndError(sum_dp2_, sum_dp4_, count_);
  const double rms = std::sqrt(dp2), rms_err = rms > 0 ? 0.5 / rms * dp2_err : 0;
  const double top = top1(), top_err = count_ > 1 ? std::sqrt(top * (1 - top) / (count_ - 1)) : 0;
  std::vector<float> sorted = kls_;
  std::sort(sorted.begin(), sorted.end());
  absl::StrAppendFormat(&out, "  positions           %lld\n", static_cast<long long>(count_));
  absl::StrAppendFormat(&out, "  PPL(run)            %.6f ± %.6f\n", std::exp(lp), std::exp(lp) * lp_err);
  absl::StrAppendFormat(&out, "  PPL(base)           %.6f ± %.6f\n", std::exp(lpb), std::exp(lpb) * lpb_err);
  absl::StrAppendFormat(&out, "  ln(PPL(run)/PPL(base)) %.6f\n", lp - lpb);
  absl::StrAppendFormat(&out, "  mean KLD            %.6g ± %.6g\n", kl, kl_err);
  absl::StrAppendFormat(&out, "  max / 99%% / median KLD  %.6g / %.6g / %.6g\n", sorted.back(),
                        Percentile(sorted, 0.99), Percentile(sorted, 0.5));
  absl::StrAppendFormat(&out, "  RMS Δp              %.4f ± %.4f %%, mean Δp %.4f %%, max |Δp| %.4f %%\n", 100 * rms,
                        100 * rms_err, 100 * sum_dp_ / count_, 100 * max_abs_dp_);
  absl::StrAppendFormat(&out, "  same top p          %.3f ± %.3f %%\n", 100 * top, 100 * top_err);
  return out;
}

}  // namespace moeshard
