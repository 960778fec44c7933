// CPU reference kernels in float32: the backend CI runs and the reference every GPU
// kernel is checked against. Row-major layouts throughout; T = tokens.
// MatMul and Attention use ThreadPool::Default(); all others are single-threaded.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/weight_ref.h"

namespace moeshard {

// y[T, w.rows] = x[T, w.cols] · Wᵀ (+ bias[w.rows] if given). Weights are expanded a few
// rows at a time and reused across all T tokens, so each weight byte is read once.
void MatMul(const float* x, int64_t T, const WeightRef& w, float* y, const float* bias = nullptr);

// out[t] = x[t] / sqrt(mean(x[t]²) + eps) * weight (weight may be null: weight-free norm).
// out may alias x.
void RmsNorm(const float* x, int64_t T, int64_t D, const float* weight, float eps, float* out);

// NeoX rotate-half RoPE in place on x[T, heads, hd] at positions pos[T].
void RopeNeox(float* x, int64_t T, int64_t heads, int64_t hd, const int32_t* pos, double theta);


// Routing: the top-k experts of each token by logit (ties to the lower index), and their
// weights: softmax over all E logits then the k picked (renormalized if `renormalize`),
// or softmax over the k picked logits (`softmax_topk_only`, which also sums to one).
void TopKRouting(const float* logits, int64_t T, int64_t E, int64_t k, bool softmax_topk_only,
                 bool renormalize, int32_t* ids, float* weights);

// Paged attention for one sequence chunk. q [T, nq, hd] at positions pos0 .. pos0+T-1;
// keys/values of positions [0, pos0+T) are in the paged cache: position p lives in block
// block_table[p / block_size], slot p % block_size, each slot holding [nkv, hd] floats.
// Causal; window > 0 hides keys with p_q - p_k >= window. out [T, nq, hd].
struct PagedKv {
  const float* k = nullptr;  // [num_blocks, block_size, nkv, hd]
  const float* v = nullptr;
  int64_t block_size = 0;
  const int32_t* block_table = nullptr;
};
void Attention(const float* q, int64_t T, int64_t nq, int64_t nkv, int64_t hd, int64_t pos0,
               const PagedKv& kv, int64_t window, float* out);

}  // namespace moeshard
