// How a cluster's tokens are compared: exactly (float32 and Q8_0 workers compute what the
// in-process float32 engine computes, so every token must be equal), or, with
// `itest --tolerance bf16`, token for token up to the first position where the two sequences
// part, which is accepted only where the float32 engine itself finds the two tokens close
// there (bf16 rounding can flip a near tie; past that point the continuations differ and are
// not compared). The rule is the one `moeshard check` applies to bf16 greedy runs, made exact
// about where it allows a difference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

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

// Two greedy continuations of `prompt` agree (see above). `what` names the comparison in the
// error.
absl::Status SameGreedy(const Context& ctx, const std::vector<int32_t>& prompt, const std::vector<int32_t>& want,
                        const std::vector<int32_t>& got, absl::string_view what);
// The same for two seeded samplings with the same settings.
absl::Status SameSampled(const Context& ctx, const std::vector<int32_t>& prompt, const std::vector<int32_t>& want,
                         const std::vector<int32_t>& got, absl::string_view what);
// True when `served` is within the logprob tolerance of `want`.
bool LogprobClose(const Context& ctx, double served, double want);

}  // namespace moeshard::itest
