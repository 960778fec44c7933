// Token sampling from one row of logits: greedy, temperature, top-k, top-p, min-p, seeded.
// A Sampler carries its own RNG (one per sequence) so that a seeded request gives the
// same tokens however it is batched. Logprobs are of the unmodified distribution.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/sampling/sampling_params.h"

namespace moeshard {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // `position`: where the sampled token will sit. With a seed, the draw depends only on
  // (seed, position), so a request's output does not depend on batching, preemption or a
  // restarted worker group.
  int32_t Sample(const float* logits, int64_t vocab, int64_t position = -1);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

// The definition Sampler::Sample implements (a seeded draw, position >= 0), by a full sort
// of the vocabulary: tests and bench/sampler_bench compare the sampler with it.
int32_t SampleByFullSort(const float* logits, int64_t vocab, const SamplingParams& p, int64_t position);

// log-softmax of one row at `id`, and the `n` most likely (id, logprob) pairs.
float LogProb(const float* logits, int64_t vocab, int32_t id);
std::vector<std::pair<int32_t, float>> TopLogProbs(const float* logits, int64_t vocab, int n);
int32_t ArgMax(const float* logits, int64_t vocab);

// What one row of a step's logits is sampled for.
struct RowDraw {
  int64_t row = 0;  // the row of the logits
  int64_t seq_id = 0;
  SamplingParams sampling;  // used when the sequence's sampler is made (its first draw)
  int64_t position = 0;     // where the sampled token will sit
  bool logprobs = false;
  int32_t top_logprobs = 0;  // at most 20 are returned
};

struct RowSample {
  int32_t token = 0;
  float logprob = 0;  // set when logprobs or top_logprobs were asked for
  std::vector<std::pair<int32_t, float>> top;
};

// The samplers of the sequences one worker samples for, one per sequence (kept across
// steps so that an unseeded sequence draws from one RNG stream). Not thread-safe.
class SamplerSet {
 public:
  // Draws each of `rows` from its row of `logits` ([*, vocab]); the draws run in parallel over the
  // rows (each sampler has its own RNG, so the tokens do not depend on which thread draws them).
  std::vector<RowSample> Sample(const std::vector<RowDraw>& rows, const float* logits, int64_t vocab);
  void Release(int64_t seq_id) { samplers_.erase(seq_id); }
  void Clear() { samplers_.clear(); }

 private:
  std::map<int64_t, Sampler> samplers_;
};

}  // namespace moeshard
