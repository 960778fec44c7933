// One warp's routing of one token (routing.cu's warp kernel, and the router GEMV that routes
// after its last block: gemv.cu): the top-k of the fp32 router logits by repeated selection
// (ties to the lower index, as the CPU reference), then the weights (softmax over all experts
// restricted to the picked ones, optionally renormalized, or over the picked logits only),
// exponentials in double as the CPU reference.
#pragma once

#include "kernels/cuda/gpu_params.h"

namespace moeshard::gpu {

inline constexpr int kRouteWarpMaxPerLane = 16;  // RouteTokenWarp takes up to 32 * 16 = 512 experts

// The better of two candidates (value, expert): larger value, then lower index; e < 0 is none.
__device__ __forceinline__ bool RouteBetter(float v, int e, float bv, int be) {
  return e >= 0 && (be < 0 || v > bv || (v == bv && e < be));
}

// Token t's routing by one warp (every lane calls it): kPer logits a lane (E <= 32 * kPer);
// each pick's value is kept from the warp reduction, so nothing is read twice. The logits
// are read through L2 (the fused router GEMV's last block reads rows other blocks wrote).
template <int kPer>
__device__ __forceinline__ void RouteTokenWarp(const RoutingParams& p, int64_t t, int lane) {
  const float* l = p.logits + t * p.num_experts;
  const int E = static_cast<int>(p.num_experts), k = static_cast<int>(p.top_k);
  float v[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) v[i] = lane + 32 * i < E ? __ldcg(l + lane + 32 * i) : 0.f;
  unsigned taken = 0;  // bit i: expert lane + 32 i already picked
  int my_id = -1;      // lane j < k keeps the j-th pick and its logit
  float my_v = 0.f, first_v = 0.f;
  for (int j = 0; j < k; ++j) {
    float bv = 0.f;
    int be = -1;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = lane + 32 * i;
      if (e < E && !((taken >> i) & 1u) && RouteBetter(v[i], e, bv, be)) {
        bv = v[i];
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


// RouteTokenWarp for any expert count up to 32 * kRouteWarpMaxPerLane (top_k <= 32).
__device__ __noinline__ inline void RouteTokenWarpAny(const RoutingParams& p, int64_t t, int lane) {
  if (p.num_experts <= 32 * 4) {
    RouteTokenWarp<4>(p, t, lane);
  } else if (p.num_experts <= 32 * 8) {
    RouteTokenWarp<8>(p, t, lane);
  } else {
    RouteTokenWarp<kRouteWarpMaxPerLane>(p, t, lane);
  }
}

}  // namespace moeshard::gpu
