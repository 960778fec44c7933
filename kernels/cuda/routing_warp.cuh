// One token's MoE routing by one warp, shared by the routing kernel (routing.cu) and the MoE
// decode kernels that fold the routing in (kernels/moe/moe_gemv.cu), so that both write
// bit-identical expert ids and weights.
//
// The order of the picks: larger logit first, equal logits by lower index, NaN below every
// number (RouteKey) — a total order, so the top-k is exactly the experts whose rank in it is
// below k, and a kernel that only needs one slot's expert may rank instead of select.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/gpu_params.h"

namespace moeshard::gpu {

__device__ __forceinline__ float RouteKey(float v) { return v != v ? -INFINITY : v; }

// The better of two candidates (key, expert): larger key, then lower index; e < 0 is none.
__device__ __forceinline__ bool RouteBetter(float v, int e, float bv, int be) {
  return e >= 0 && (be < 0 || v > bv || (v == bv && e < be));
}

// Token t's top-k and weights (RoutingParams): lane i holds experts i, i + 32, ... (kPer a lane,
// E <= 32 * kPer); a selection round is a warp argmax whose winner's key is kept, so nothing is
// read twice. Exponentials in double, as the CPU reference. Every lane of the warp calls it.
template <int kPer>
__device__ __forceinline__ void RouteTokenWarp(const RoutingParams& p, int64_t t, int lane) {
  const float* l = p.logits + t * p.num_experts;
  const int E = static_cast<int>(p.num_experts), k = static_cast<int>(p.top_k);
  float v[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) v[i] = lane + 32 * i < E ? __ldcg(l + lane + 32 * i) : 0.f;
  unsigned taken = 0;  // bit i: expert lane + 32 i already picked
  int my_id = -1;      // lane j < k keeps the j-th pick and its key
  float my_v = 0.f, first_v = 0.f;
  for (int j = 0; j < k; ++j) {
    float bv = 0.f;
    int be = -1;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = lane + 32 * i;
      if (e < E && !((taken >> i) & 1u) && RouteBetter(RouteKey(v[i]), e, bv, be)) {
        bv = RouteKey(v[i]);
        be = e;
      }
    }
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int oe = __shfl_xor_sync(0xffffffffu, be, off);
      if (RouteBetter(ov, oe, bv, be)) {
        bv = ov;
        be = oe;
      }
    }
    be = max(be, 0);  // a candidate always exists (k <= E)
    if ((be & 31) == lane) taken |= 1u << (be >> 5);
    if (lane == j) {
      my_id = be;
      my_v = bv;
    }
    if (j == 0) first_v = bv;
  }
  const double m = first_v;
  double sum = 0;
  if (p.softmax_topk_only) {
    double part = lane < k ? exp(static_cast<double>(my_v) - m) : 0.0;
    for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
    sum = part;
  } else {
    double part = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (lane + 32 * i < E) part += exp(static_cast<double>(v[i]) - m);
    }
    for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
    sum = part;
  }
  float w = lane < k ? static_cast<float>(exp(static_cast<double>(my_v) - m) / sum) : 0.f;
  if (!p.softmax_topk_only && p.renormalize) {
    double picked = w;
    for (int off = 16; off > 0; off >>= 1) picked += __shfl_xor_sync(0xffffffffu, picked, off);
    w = static_cast<float>(w / picked);
  }
  if (lane < k) {
    const int64_t local = my_id - p.expert_begin;
    p.local_ids[t * k + lane] = (local >= 0 && local < p.num_local_experts) ? static_cast<int32_t>(local) : -1;
    p.weights[t * k + lane] = w;
    if (p.global_ids) p.global_ids[t * k + lane] = my_id;
  }
}

// The warp routine for E experts: false when E is past what it holds.
inline constexpr int64_t kRouteWarpMaxExperts = 32 * 16;
__device__ __forceinline__ bool RouteTokenWarpAny(const RoutingParams& p, int64_t t, int lane) {
  if (p.num_experts <= 32 * 4) {
    RouteTokenWarp<4>(p, t, lane);
  } else if (p.num_experts <= 32 * 8) {
    RouteTokenWarp<8>(p, t, lane);
  } else if (p.num_experts <= kRouteWarpMaxExperts) {
    RouteTokenWarp<16>(p, t, lane);
  } else {
    return false;
  }
  return true;
}

}  // namespace moeshard::gpu
