// The sampler's draw over a whole large vocabulary (no top-k) without sorting it. The definition
// (SampleByFullSort) walks candidates in order of logit — min-p and top-p cut that order, the
// draw walks it to the first cumulative probability past r — and a flat distribution (temperature
// 1 on a wide vocabulary) sends the walk thousands of candidates deep: the sampler's prefix sort
// then grew by nth_element over every id, several times a token (~4 ms on a 151,936-entry row).
//
// Here one pass weighs every id (w = exp((l - max) / t), vectorized) and files it in one of 4,096
// buckets by w's exponent range (the logit order, coarsely: a bucket holds ids of nearby logits),
// and a second sums each bucket's weight. A walk then skips whole buckets by their weight; only a
// bucket where it stops is gathered (one scan) and sorted. min-p keeps the ids with w >= min_p (the first n of the
// order, since the order is by w). The sums run in another order than the definition's single
// running sum (~1e-16 apart), so a draw within that of a boundary could differ; nothing else can.
#pragma once

#include <cstdint>
#include <random>

namespace moeshard {

// One draw from logits[0, vocab) at temperature 1 / inv_t with top_p (1: none) and min_p (0:
// none), as SampleByFullSort with top_k 0 gives it, drawing its uniform from `rng` as it does.
int32_t SampleWholeVocabulary(const float* logits, int64_t vocab, double inv_t, float top_p, float min_p,
                              std::mt19937_64& rng);

}  // namespace moeshard
