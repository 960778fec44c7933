#include "tests/itest/token_match.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "tests/itest/client.h"
#include "tests/itest/suite.h"
#include "common/status.h"

namespace moeshard::itest {
namespace {

// The first position where the two differ, or -1 when one is a prefix of the other.
int64_t FirstDifference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

// Where `want` and `got` part at position i, the float32 engine's log-probabilities of the
// next token after prompt + want[0, i).
absl::StatusOr<std::vector<double>> RowAt(const Context& ctx, const std::vector<int32_t>& prompt,
                                          const std::vector<int32_t>& want, int64_t i) {
  if (ctx.reference == nullptr) return absl::FailedPreconditionError("bf16 tolerance needs --model");
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), want.begin(), want.begin() + i);
  ASSIGN_OR_RETURN(auto rows, ctx.reference->LogProbs(seq, 1));
  return std::move(rows.back());
}

// Exact equality, or the tolerance's test at the first difference (`accept` sees the two
// tokens' float32 log-probabilities there).
template <typename Accept>
absl::Status Compare(const Context& ctx, const std::vector<int32_t>& prompt, const std::vector<int32_t>& want,
                     const std::vector<int32_t>& got, absl::string_view what, const char* rule, Accept accept) {
  if (want == got) return absl::OkStatus();
  const std::string diff = absl::StrCat(what, ": ", DescribeDiff(want, got));
  const int64_t i = FirstDifference(want, got);
  if (ctx.tolerance == Tolerance::kExact || i < 0) return absl::InternalError(diff);
  ASSIGN_OR_RETURN(auto lp, RowAt(ctx, prompt, want, i));
  const int64_t V = static_cast<int64_t>(lp.size());
  if (want[i] < 0 || want[i] >= V || got[i] < 0 || got[i] >= V)
    return absl::InternalError(absl::StrCat(diff, " (a token outside the vocabulary)"));
  if (accept(lp[want[i]], lp[got[i]])) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(diff, "; at position ", i, " the float32 engine gives ", want[i], " ",
                                          lp[want[i]], " and ", got[i], " ", lp[got[i]], ": outside the bf16 ", rule));
}

}  // namespace

absl::Status ParseTolerance(absl::string_view s, Tolerance* out) {
  if (s.empty() || s == "exact") {
    *out = Tolerance::kExact;
  } else if (s == "bf16") {
    *out = Tolerance::kBf16;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown --tolerance '", s, "' (exact, bf16)"));
  }
  return absl::OkStatus();
}

absl::Status SameGreedy(const Context& ctx, const std::vector<int32_t>& prompt, const std::vector<int32_t>& want,
                        const std::vector<int32_t>& got, absl::string_view what) {
  return Compare(ctx, prompt, want, got, what, "greedy margin",
                 [](double a, double b) { return std::fabs(a - b) <= kBf16GreedyMargin; });
}

absl::Status SameSampled(const Context& ctx, const std::vector<int32_t>& prompt, const std::vector<int32_t>& want,
                         const std::vector<int32_t>& got, absl::string_view what) {
  return Compare(ctx, prompt, want, got, what, "sampling bound",
                 [](double a, double b) { return b >= std::min(std::log(kBf16MinSampledProb), a - kBf16GreedyMargin); });
}

bool LogprobClose(const Context& ctx, double served, double want) {
  if (ctx.tolerance == Tolerance::kBf16) return std::fabs(served - want) <= kBf16LogprobTol;
  return std::fabs(served - want) <= kExactLogprobTol * std::max(1.0, std::fabs(want));
}

}  // namespace moeshard::itest
