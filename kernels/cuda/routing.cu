// MoE routing and small elementwise kernels.
//
// Routing: the top-k of each token's fp32 router logits by repeated selection (ties to the
// lower index, as the CPU reference), then the weights: softmax over all experts restricted
// to the picked ones (optionally renormalized), or softmax over the picked logits only.
// Exponentials in double, as the CPU reference. One warp per token (each lane holds
// experts lane, lane + 32, ...; a selection round is two warp reductions) up to 512 experts;
// one thread per token beyond.
#include "kernels/cuda/act.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/routing_warp.cuh"

namespace moeshard::gpu {
namespace {

constexpr int kMaxTopK = 32;

__global__ void RoutingKernel(RoutingParams p) {
  PdlWait();
  PdlTrigger();
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= p.num_tokens) return;
  const float* l = p.logits + t * p.num_experts;
  int32_t ids[kMaxTopK];
  const int k = static_cast<int>(p.top_k);
  for (int j = 0; j < k; ++j) {
    int32_t best = -1;
    for (int32_t e = 0; e < p.num_experts; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= ids[i] == e;
      if (taken) continue;
      if (best < 0 || l[e] > l[best]) best = e;
    }
    ids[j] = best;
  }
  const double m = l[ids[0]];
  double sum = 0, w[kMaxTopK];
  if (p.softmax_topk_only) {
    for (int j = 0; j < k; ++j) sum += exp(static_cast<double>(l[ids[j]]) - m);
    for (int j = 0; j < k; ++j) w[j] = static_cast<float>(exp(static_cast<double>(l[ids[j]]) - m) / sum);
  } else {
    for (int64_t e = 0; e < p.num_experts; ++e) sum += exp(static_cast<double>(l[e]) - m);
    double picked = 0;
    for (int j = 0; j < k; ++j) {
      w[j] = static_cast<float>(exp(static_cast<double>(l[ids[j]]) - m) / sum);
      picked += w[j];
    }
    if (p.renormalize) {
      for (int j = 0; j < k; ++j) w[j] = static_cast<float>(w[j] / picked);
    }
  }
  for (int j = 0; j < k; ++j) {
    const int64_t local = ids[j] - p.expert_begin;
    p.local_ids[t * k + j] = (local >= 0 && local < p.num_local_experts) ? static_cast<int32_t>(local) : -1;
    p.weights[t * k + j] = static_cast<float>(w[j]);
    if (p.global_ids) p.global_ids[t * k + j] = ids[j];
  }
}

constexpr int kWarpPerLane = 16;  // the warp kernel holds up to 32 * 16 = 512 experts

// One warp a token (routing_warp.cuh).
template <int kPer>
__global__ void RoutingWarpKernel(RoutingParams p) {
  PdlWait();
  PdlTrigger();
  const int lane = threadIdx.x & 31;
  const int64_t t = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (t >= p.num_tokens) return;  // whole warps leave together
  RouteTokenWarp<kPer>(p, t, lane);
}

template <typename Act>
__global__ void SiluMulKernel(SiluMulParams p) {
  const Act* g = static_cast<const Act*>(p.gate);
  const Act* u = static_cast<const Act*>(p.up);
  Act* o = static_cast<Act*>(p.out);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < p.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = LoadF(g + i);
    StoreF(o + i, x / (1.f + expf(-x)) * LoadF(u + i));
  }
}

template <typename Act>
__global__ void HeadGateKernel(HeadGateParams p) {
  Act* o = static_cast<Act*>(p.o);
  const Act* g = static_cast<const Act*>(p.gate);
  const int64_t n = p.num_tokens * p.heads * p.head_dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float gate = 1.f / (1.f + expf(-LoadF(g + i / p.head_dim)));
    StoreF(o + i, LoadF(o + i) * gate);
  }
}

template <typename Act>
__global__ void AddBiasKernel(AddBiasParams p) {
  Act* y = static_cast<Act*>(p.y);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < p.rows * p.cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    StoreF(y + i, LoadF(y + i) + p.bias[i % p.cols]);
  }
}

template <typename In, typename Out>
__global__ void ConvertKernel(const In* x, Out* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    StoreF(y + i, LoadF(x + i));
  }
}

unsigned GridFor(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 4096)); }

}  // namespace

int64_t MaxRoutingTopK() { return kMaxTopK; }

cudaError_t LaunchRouting(const RoutingParams& p, cudaStream_t st) {
  if (p.num_experts <= 32 * kWarpPerLane && p.top_k <= 32) {
    const unsigned grid = static_cast<unsigned>((p.num_tokens + 3) / 4);  // 4 tokens a block
    if (p.num_experts <= 32 * 4) return LaunchPdl(RoutingWarpKernel<4>, grid, 128, 0, st, p);
    if (p.num_experts <= 32 * 8) return LaunchPdl(RoutingWarpKernel<8>, grid, 128, 0, st, p);
    return LaunchPdl(RoutingWarpKernel<kWarpPerLane>, grid, 128, 0, st, p);
  }
  return LaunchPdl(RoutingKernel, static_cast<unsigned>((p.num_tokens + 127) / 128), 128, 0, st, p);
}

cudaError_t LaunchSiluMul(const SiluMulParams& p, cudaStream_t st) {
  if (p.dtype == ActDType::kF32) {
    SiluMulKernel<float><<<GridFor(p.n), 256, 0, st>>>(p);
  } else {
    SiluMulKernel<uint16_t><<<GridFor(p.n), 256, 0, st>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t LaunchHeadGate(const HeadGateParams& p, cudaStream_t st) {
  const int64_t n = p.num_tokens * p.heads * p.head_dim;
  if (p.dtype == ActDType::kF32) {
    HeadGateKernel<float><<<GridFor(n), 256, 0, st>>>(p);
  } else {
    HeadGateKernel<uint16_t><<<GridFor(n), 256, 0, st>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(const AddBiasParams& p, cudaStream_t st) {
  if (p.dtype == ActDType::kF32) {
    AddBiasKernel<float><<<GridFor(p.rows * p.cols), 256, 0, st>>>(p);
  } else {
    AddBiasKernel<uint16_t><<<GridFor(p.rows * p.cols), 256, 0, st>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t LaunchConvert(const ConvertParams& p, cudaStream_t st) {
  const unsigned g = GridFor(p.n);
  const bool f_in = p.x_dtype == ActDType::kF32, f_out = p.y_dtype == ActDType::kF32;
  if (f_in && f_out) {
    ConvertKernel<<<g, 256, 0, st>>>(static_cast<const float*>(p.x), static_cast<float*>(p.y), p.n);
  } else if (f_in) {
    ConvertKernel<<<g, 256, 0, st>>>(static_cast<const float*>(p.x), static_cast<uint16_t*>(p.y), p.n);
  } else if (f_out) {
    ConvertKernel<<<g, 256, 0, st>>>(static_cast<const uint16_t*>(p.x), static_cast<float*>(p.y), p.n);
  } else {
    ConvertKernel<<<g, 256, 0, st>>>(static_cast<const uint16_t*>(p.x), static_cast<uint16_t*>(p.y), p.n);
  }
  return cudaGetLastError();
}

}  // namespace moeshard::gpu
