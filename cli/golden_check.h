// Compares a model's logits and greedy generations with a goldens.safetensors file
// (format: ../shared/testdata/README.md): seq{k}.ids with seq{k}.logits, or with
// seq{k}.topk_ids / topk_logits and seq{k}.lse for large vocabularies; gen{k}.prompt and
// gen{k}.greedy. Each sequence runs whole, as prefill + one-token decode steps, and all
// together in one ragged batch; every run must meet the tolerance profile.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model_loader.h"

namespace moeshard {

enum class Tolerance { kFp32, kQ8_0, kBf16 };
absl::StatusOr<Tolerance> ParseTolerance(const std::string& s);

struct SeqReport {
  std::string name;    // e.g. "seq1 decode"
  double max_err = 0;  // fp32: max |l - g| / max(1, |g|); top-k: max top-20 logit diff
  double max_lse_err = 0;
  double mean_kl = 0, max_kl = 0;  // full-logit goldens only
  double top1 = 0;                 // fraction of positions whose argmax agrees
  int64_t positions = 0;
  bool pass = false;
};

struct GenReport {
  std::string name;
  std::vector<int32_t> expected, got;
  bool pass = false;
};

struct CheckReport {
  std::vector<SeqReport> seqs;
  std::vector<GenReport> gens;
  bool pass() const;
  std::string Format() const;
};

// Logits [T, V] for a whole sequence fed from position 0: the seam through which a
// cluster (or any engine) is checked with the same goldens.
using LogitsFn = std::function<absl::StatusOr<std::vector<float>>(const std::vector<int32_t>& ids)>;
using GreedyFn = std::function<absl::StatusOr<std::vector<int32_t>>(const std::vector<int32_t>& prompt, int64_t n)>;

// Runs the goldens on a loaded model, in-process (whole, decode and batch modes).
absl::StatusOr<CheckReport> CheckModel(const LoadedModel& model, const std::string& goldens_path, Tolerance tol);
// Runs only whole-sequence logits and greedy generation through the given functions.
absl::StatusOr<CheckReport> CheckWith(const LogitsFn& logits, const GreedyFn& greedy, int64_t vocab,
                                      const std::string& goldens_path, Tolerance tol);

}  // namespace moeshard
