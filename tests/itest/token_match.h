// How a cluster's tokens are compared: exactly (float32 and Q8_0 workers compute what the
// in-process float32 engine computes, so every token must be equal), or, with
// `itest --tolerance bf16`, token for token up to the first position where the two sequences
// part, which is accepted only where the float32 engine itself finds the two tokens close
// there (bf16 rounding can flip a near tie; past that point the continuations differ and are
// not compared). The rule is the one `moeshard check` applies to bf16 greedy runs, made exact
// about where it allows a difference. A parting (or a logprob) the final logits do not explain
// may still come from a near tie inside the model — the router's k-th and (k+1)-th experts — and
// is accepted where the float32 engine run with such a tie decided the other way gives what was
// served (kBf16RouteTie below).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "tests/itest/reference_engine.h"

namespace moeshard::itest {

struct Context;

enum class Tolerance { kExact, kBf16 };

// Parses --tolerance: "exact" (the default) or "bf16".
absl::Status ParseTolerance(absl::string_view s, Tolerance* out);

// bf16: the most two parting greedy tokens may differ in the float32 engine's log-probability
// (nats). Each token's bf16 logprob may be off by up to kBf16LogprobTol, so a gap of twice that
// can flip; 1.5 covers what the GPU lane saw on the test models (flips at gaps of 0.64–1.11
// nats, H200, 2026-12-01) while a wrong kernel, which parts at gaps of several nats, still fails.
inline constexpr double kBf16GreedyMargin = 1.5;
// bf16: a parting sampled token must be likely enough under the float32 engine: at least
// kBf16MinSampledProb, or within the greedy margin of the token the engine drew (in a flat
// distribution, e.g. a random 151K-token vocabulary, every candidate is below 1e-3).
inline constexpr double kBf16MinSampledProb = 1e-3;
// Logprob values, exact: |served - float32| <= 2e-3 * max(1, |float32|), the fp32 logit
// tolerance of ../shared/testdata/README.md doubled for the log-sum-exp subtracted from both;
// bf16: |served - float32| <= 0.5 nats, `moeshard check`'s bf16 log-sum-exp bound.
inline constexpr double kExactLogprobTol = 2e-3;
inline constexpr double kBf16LogprobTol = 0.5;
// bf16: a parting, or a logprob off by more than kBf16LogprobTol, that the final logits do not
// explain is accepted where a near tie inside the model does: the float32 router's k-th and
// (k+1)-th experts at most kBf16RouteTie apart at a position up to there. bf16 activations move
// the router's input by ~0.1-0.5 % (the demo model traced on the H200, 2026-12-04: its bf16 run
// picked another expert where float32's margin was 0.000339, and the rows then parted by 17 %).
// Each of the kRouteTiesTried nearest such ties is decided the other way in turn, and the float32
// engine so run must give what was served; a wrong kernel would have to reproduce another
// routing's tokens and logprobs to pass, so the bound may be generous.
inline constexpr double kBf16RouteTie = 0.05;
inline constexpr int kRouteTiesTried = 3;

// Two greedy continuations of `prompt` agree (see above). `what` names the comparison in the
// error.
absl::Status SameGreedy(const Context& ctx, const std::vector<int32_t>& prompt, const std::vector<int32_t>& want,
                        const std::vector<int32_t>& got, absl::string_view what);
// SameGreedy's step for one router tie: `got` against the float32 engine's greedy continuation
// with `tie` decided the other way — equal over [0, from) (the tokens already matched without
// the tie) and from there up to a parting at a near tie of that run's final logits.
absl::Status SameGreedyUnder(const Context& ctx, const std::vector<int32_t>& prompt, const RouteTie& tie,
                             const std::vector<int32_t>& got, absl::string_view what, int64_t from);
// The same for two seeded samplings with the same settings.
absl::Status SameSampled(const Context& ctx, const std::vector<int32_t>& prompt, const std::vector<int32_t>& want,
                         const std::vector<int32_t>& got, absl::string_view what);
// What a response served, position by position: the prompt, the tokens, each token's logprob and
// its listed alternatives' logprobs, most likely first.
struct ServedLogprobs {
  std::vector<int32_t> prompt, tokens;
  std::vector<double> chosen;
  std::vector<std::vector<double>> top;
};
// Each chosen logprob and each alternative's against the float32 engine's log-softmax over the
// same tokens (LogprobClose). bf16: where a position differs, the engine run with one of its
// router's near ties up to there decided the other way may give them instead (all of them: one
// routing explains every position).
absl::Status SameLogprobs(const Context& ctx, const ServedLogprobs& s);
// True when `served` is within the logprob tolerance of `want`.
bool LogprobClose(const Context& ctx, double served, double want);
// The float32 router's ties to try where the token after seq's first `upto` positions differs:
// in bf16 mode the ctx.route_ties_tried (kRouteTiesTried) nearest within ctx.route_tie_bound
// (kBf16RouteTie) over positions [0, upto),
// nearest first; none in exact mode or without the in-process engine.
absl::StatusOr<std::vector<RouteTie>> NearRouteTies(const Context& ctx, const std::vector<int32_t>& seq, int64_t upto);
// Names a tie in messages: "layer L position P: experts A / B, margin M".
std::string DescribeTie(const RouteTie& t);

}  // namespace moeshard::itest
