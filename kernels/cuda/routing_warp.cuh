// One token's MoE routing by one warp (routing.cu's RoutingWarpKernel; its own header since the
// experts' direct GEMV shared it for a fold of the routing that measured slower, 2026-12-07): the
// top-k of the token's fp32 router logits by repeated selection, ties to the lower index as the CPU
// reference, then the weights (softmax over all experts restricted to the picked ones, optionally
// renormalized, or over the picked logits only; exponentials in double as the CPU reference).
#pragma once

#include <cstdint>

#include "kernels/cuda/gpu_params.h"

namespace moeshard::gpu {

// A logit as a key whose unsigned order is the values' order: -0 as +0 (they tie, as the CPU's
// comparisons have it), NaN as 1 (below every number), 0 left for "none".
__device__ __forceinline__ uint32_t RouteKey(float v) {
  if (v != v) return 1u;
  const uint32_t u = __float_as_uint(v == 0.f ? 0.f : v);
  return u >> 31 ? ~u : u | 0x80000000u;
}
__device__ __forceinline__ float RouteKeyValue(uint32_t key) {
  return __uint_as_float(key >> 31 ? key & 0x7FFFFFFFu : ~key);
}

// A warp's picks: lane j < k holds the j-th pick (global expert id) and its logit.
template <int kPer>
struct RoutePicks {
  float v[kPer];  // the token's logits, lane + 32 i (0 past E)
  int my_id = -1;
  float my_v = 0.f, first_v = 0.f;
};

// kPer logits a lane (E <= 32 * kPer), read from `l`. Each round picks the largest remaining
// logit, the lower expert index on ties, by two warp reductions (redux.sync): the largest key, then
// among the lanes holding it the lowest index (as ~index); a lane's best is its first largest key
// (i ascending is index ascending), and the picked value is read back from its key, so nothing is
// read twice.
// Replaced (2026-12-06) an argmax of (value, index) pairs by five shuffle rounds a pick: the
// routing kernel's share of Qwen3-30B's decode chain 4.50 -> 3.16 µs a layer (H100, probe build).
template <int kPer>
__device__ __forceinline__ RoutePicks<kPer> RouteSelectWarp(const float* l, int E, int k, int lane) {
  RoutePicks<kPer> r;
  uint32_t key[kPer];  // 0: past E or picked
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    r.v[i] = e < E ? l[e] : 0.f;
    key[i] = e < E ? RouteKey(r.v[i]) : 0u;
  }
  for (int j = 0; j < k; ++j) {
    uint32_t bk = 0, bi = 0;  // this lane's best key and its ~index
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (key[i] > bk) {
        bk = key[i];
        bi = ~static_cast<uint32_t>(lane + 32 * i);
      }
    }
    const uint32_t top = __reduce_max_sync(0xffffffffu, bk);  // >= 1: k <= E leaves a candidate
    const uint32_t e = ~__reduce_max_sync(0xffffffffu, bk == top ? bi : 0u);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (static_cast<uint32_t>(lane + 32 * i) == e) key[i] = 0u;
    }
    const float bv = RouteKeyValue(top);
    if (lane == j) {
      r.my_id = static_cast<int>(e);
      r.my_v = bv;
    }
    if (j == 0) r.first_v = bv;
  }
  return r;
}

// A global expert id as this GPU's local index, or -1 (another GPU's).
__device__ __forceinline__ int32_t RouteLocal(const RoutingParams& p, int id) {
  const int64_t local = id - p.expert_begin;
  return (local >= 0 && local < p.num_local_experts) ? static_cast<int32_t>(local) : -1;
}

// Token t's weights from its picks, and its local ids, weights and (optional) global ids stored.
template <int kPer>
__device__ __forceinline__ void RouteStoreWarp(const RoutingParams& p, int64_t t, int lane, const RoutePicks<kPer>& r) {
  const int E = static_cast<int>(p.num_experts), k = static_cast<int>(p.top_k);
  const double m = r.first_v;
  double sum = 0;
  if (p.softmax_topk_only) {
    double part = lane < k ? exp(static_cast<double>(r.my_v) - m) : 0.0;
    for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
    sum = part;
  } else {
    double part = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (lane + 32 * i < E) part += exp(static_cast<double>(r.v[i]) - m);
    }
    for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
    sum = part;
  }
  float w = lane < k ? static_cast<float>(exp(static_cast<double>(r.my_v) - m) / sum) : 0.f;
  if (!p.softmax_topk_only && p.renormalize) {
    double picked = w;
    for (int off = 16; off > 0; off >>= 1) picked += __shfl_xor_sync(0xffffffffu, picked, off);
    w = static_cast<float>(w / picked);
  }
  if (lane < k) {
    p.local_ids[t * k + lane] = RouteLocal(p, r.my_id);
    p.weights[t * k + lane] = w;
    if (p.global_ids) p.global_ids[t * k + lane] = r.my_id;
  }
}

// The whole of token t's routing by one warp (E <= 32 * kPer, k <= 32).
template <int kPer>
__device__ __forceinline__ void RouteTokenWarp(const RoutingParams& p, int64_t t, int lane) {
  const RoutePicks<kPer> r = RouteSelectWarp<kPer>(p.logits + t * p.num_experts, static_cast<int>(p.num_experts),
                                                   static_cast<int>(p.top_k), lane);
  RouteStoreWarp<kPer>(p, t, lane, r);
}

}  // namespace moeshard::gpu
