#include "tests/itest/token_match.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "tests/itest/client.h"
#include "tests/itest/suite.h"

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

// prompt + want[0, i).
std::vector<int32_t> Prefix(const std::vector<int32_t>& prompt, const std::vector<int32_t>& want, int64_t i) {
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), want.begin(), want.begin() + i);
  return seq;
}

// Where `want` and `got` part at position i, the float32 engine's log-probabilities of the
// next token after prompt + want[0, i) (run with `swap` decided the other way, where given).
absl::StatusOr<std::vector<double>> RowAt(const Context& ctx, const std::vector<int32_t>& prompt,
                                          const std::vector<int32_t>& want, int64_t i, const RouteTie* swap) {
  if (ctx.reference == nullptr) return absl::FailedPreconditionError("bf16 tolerance needs --model");
  ASSIGN_OR_RETURN(auto rows, ctx.reference->LogProbs(Prefix(prompt, want, i), 1, swap));
  return std::move(rows.back());
}

// Exact equality, or the tolerance's test at the first difference (`accept` sees the two
// tokens' float32 log-probabilities there; `want` is the float32 engine's run with `swap`
// decided the other way, where given).
template <typename Accept>
absl::Status Compare(const Context& ctx, const std::vector<int32_t>& prompt, const std::vector<int32_t>& want,
                     const std::vector<int32_t>& got, absl::string_view what, const char* rule, Accept accept,
                     const RouteTie* swap = nullptr) {
  if (want == got) return absl::OkStatus();
  const std::string diff = absl::StrCat(what, ": ", DescribeDiff(want, got));
  const int64_t i = FirstDifference(want, got);
  if (ctx.tolerance == Tolerance::kExact || i < 0) return absl::InternalError(diff);
  ASSIGN_OR_RETURN(auto lp, RowAt(ctx, prompt, want, i, swap));
  const int64_t V = static_cast<int64_t>(lp.size());
  if (want[i] < 0 || want[i] >= V || got[i] < 0 || got[i] >= V)
    return absl::InternalError(absl::StrCat(diff, " (a token outside the vocabulary)"));
  if (accept(lp[want[i]], lp[got[i]])) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(diff, "; at position ", i, " the float32 engine gives ", want[i], " ",
                                          lp[want[i]], " and ", got[i], " ", lp[got[i]], ": outside the bf16 ", rule));
}

// The served values of positions [from, n) against the engine's rows; *bad: the first that differs.
absl::Status MatchRows(const Context& ctx, const ServedLogprobs& s, const std::vector<std::vector<double>>& rows,
                       size_t from, size_t* bad) {
  for (size_t i = from; i < s.tokens.size(); ++i) {
    *bad = i;
    const std::vector<double>& lp = rows[i];
    const int32_t id = s.tokens[i];
    if (id < 0 || id >= static_cast<int32_t>(lp.size()))
      return absl::InternalError(absl::StrCat("position ", i, ": token ", id, " outside the vocabulary"));
    if (!LogprobClose(ctx, s.chosen[i], lp[id])) {
      return absl::InternalError(absl::StrCat("position ", i, ": token ", id, " served logprob ", s.chosen[i],
                                              ", the in-process engine gives ", lp[id]));
    }
    const size_t top = s.top[i].size();
    if (top > lp.size()) return absl::InternalError(absl::StrCat("position ", i, ": more alternatives than tokens"));
    std::vector<double> want = lp;
    std::partial_sort(want.begin(), want.begin() + top, want.end(), std::greater<>());
    for (size_t k = 0; k < top; ++k) {
      if (!LogprobClose(ctx, s.top[i][k], want[k])) {
        return absl::InternalError(absl::StrCat("position ", i, ": top_logprobs[", k, "] served ", s.top[i][k],
                                                ", the in-process engine gives ", want[k]));
      }
    }
  }
  return absl::OkStatus();
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
  auto margin = [](double a, double b) { return std::fabs(a - b) <= kBf16GreedyMargin; };
  const absl::Status st = Compare(ctx, prompt, want, got, what, "greedy margin", margin);
  if (st.ok() || ctx.tolerance != Tolerance::kBf16 || ctx.reference == nullptr) return st;
  const int64_t i = FirstDifference(want, got);
  if (i < 0) return st;
  // A near tie inside the model up to the parting (the rows of prompt + want[0, i)).
  const std::vector<int32_t> seq = Prefix(prompt, want, i);
  ASSIGN_OR_RETURN(std::vector<RouteTie> ties, NearRouteTies(ctx, seq, static_cast<int64_t>(seq.size())));
  std::string tried;
  for (const RouteTie& t : ties) {
    const absl::Status u = SameGreedyUnder(ctx, prompt, t, got, what, i);
    if (u.ok()) return u;
    if (u.code() != absl::StatusCode::kInternal) return u;  // not a mismatch: the engine's error
    absl::StrAppend(&tried, tried.empty() ? "" : "; ", DescribeTie(t));
  }
  return absl::InternalError(absl::StrCat(st.message(), tried.empty() ? "; no router tie within the bound up to there"
                                                                      : "; nor with these router ties decided the "
                                                                        "other way: " +
                                                                            tried));
}

absl::Status SameSampled(const Context& ctx, const std::vector<int32_t>& prompt, const std::vector<int32_t>& want,
                         const std::vector<int32_t>& got, absl::string_view what) {
  return Compare(ctx, prompt, want, got, what, "sampling bound",
                 [](double a, double b) { return b >= std::min(std::log(kBf16MinSampledProb), a - kBf16GreedyMargin); });
}

absl::Status SameGreedyUnder(const Context& ctx, const std::vector<int32_t>& prompt, const RouteTie& tie,
                             const std::vector<int32_t>& got, absl::string_view what, int64_t from) {
  if (ctx.reference == nullptr) return absl::FailedPreconditionError("bf16 tolerance needs --model");
  ASSIGN_OR_RETURN(std::vector<int32_t> alt, ctx.reference->Greedy(prompt, static_cast<int64_t>(got.size()), &tie));
  // The tokens before `from` must be this run's too: its own near ties may not excuse them.
  const int64_t d = FirstDifference(alt, got);
  if (d >= 0 && d < from) {
    return absl::InternalError(absl::StrCat(what, ": with ", DescribeTie(tie), " decided the other way the float32 ",
                                            "engine parts from the served tokens at ", d, ", before ", from));
  }
  return Compare(
      ctx, prompt, alt, got, what, "greedy margin",
      [](double a, double b) { return std::fabs(a - b) <= kBf16GreedyMargin; }, &tie);
}

absl::StatusOr<std::vector<RouteTie>> NearRouteTies(const Context& ctx, const std::vector<int32_t>& seq, int64_t upto) {
  if (ctx.tolerance != Tolerance::kBf16 || ctx.reference == nullptr || upto < 1 || ctx.route_tie_bound < 0 ||
      ctx.route_ties_tried < 1) {
    return std::vector<RouteTie>{};
  }
  ASSIGN_OR_RETURN(std::vector<RouteTie> ties, ctx.reference->RouteTies(seq, upto, ctx.route_ties_tried));
  std::vector<RouteTie> near;
  for (const RouteTie& t : ties) {
    if (t.margin <= ctx.route_tie_bound) near.push_back(t);
  }
  return near;
}

std::string DescribeTie(const RouteTie& t) {
  return absl::StrCat("layer ", t.layer, " position ", t.position, ": experts ", t.picked, " / ", t.next, ", margin ",
                      t.margin);
}

bool LogprobClose(const Context& ctx, double served, double want) {
  if (ctx.tolerance == Tolerance::kBf16) return std::fabs(served - want) <= kBf16LogprobTol;
  return std::fabs(served - want) <= kExactLogprobTol * std::max(1.0, std::fabs(want));
}

// The served values against the in-process engine's log-softmax over the same tokens. In bf16
// mode, from the first position that differs on, against the engine run with one of its router's
// near ties up to there decided the other way (token_match.h, kBf16RouteTie), where one gives them.
absl::Status SameLogprobs(const Context& ctx, const ServedLogprobs& s) {
  if (ctx.reference == nullptr) return absl::FailedPreconditionError("logprobs: the comparison needs --model");
  if (s.prompt.empty() || s.tokens.empty() || s.tokens.size() != s.chosen.size() || s.tokens.size() != s.top.size())
    return absl::InternalError("the response lacks prompt_token_ids or token_ids (return_token_ids)");
  std::vector<int32_t> seq = s.prompt;
  seq.insert(seq.end(), s.tokens.begin(), s.tokens.end() - 1);
  const int64_t n = static_cast<int64_t>(s.tokens.size());
  ASSIGN_OR_RETURN(auto rows, ctx.reference->LogProbs(seq, n));
  size_t bad = 0;
  const absl::Status st = MatchRows(ctx, s, rows, 0, &bad);
  if (st.ok()) return st;
  // Position `bad` is predicted by the row of seq's position prompt + bad - 1: ties up to it.
  ASSIGN_OR_RETURN(std::vector<RouteTie> ties, NearRouteTies(ctx, seq, static_cast<int64_t>(s.prompt.size() + bad)));
  std::string tried;
  for (const RouteTie& t : ties) {
    ASSIGN_OR_RETURN(auto alt, ctx.reference->LogProbs(seq, n, &t));
    // Every position against the one run (rows before the tie's position are the same in both).
    size_t alt_bad = 0;  // unused: the first error is the one reported
    if (MatchRows(ctx, s, alt, 0, &alt_bad).ok()) return absl::OkStatus();
    absl::StrAppend(&tried, tried.empty() ? "" : "; ", DescribeTie(t));
  }
  if (tried.empty()) return st;
  return absl::InternalError(absl::StrCat(st.message(), "; nor with these router ties decided the other way: ", tried));
}

}  // namespace moeshard::itest
