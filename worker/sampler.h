// Token sampling from one row of logits: greedy, temperature, top-k, top-p, min-p, seeded.
// A Sampler carries its own RNG (one per sequence) so that a seeded request gives the
// same tokens however it is batched. Logprobs are of the unmodified distribution.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace moeshard {

struct SamplingParams {
  float temperature = 0.f;  // 0 = greedy
  int32_t top_k = 0;        // 0 = off
  float top_p = 1.f;        // 1 = off
  float min_p = 0.f;        // 0 = off
  uint64_t seed = 0;
  bool has_seed = false;

  absl::Status Validate() const;
};

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

}  // namespace moeshard
