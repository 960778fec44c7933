// Per-row kernels of the residual stream: embedding lookup, RMSNorm (optionally gathering
// rows and writing a second fp32 copy), the residual update (plain, or Muse Spark's gated
// form with the output norm fused in) and NeoX RoPE. One block per row; sums of squares
// in fp32 through a block reduction.
#include "kernels/cuda/act.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/pdl.cuh"

namespace moeshard::gpu {
namespace {

constexpr int kRowThreads = 256;

__global__ void EmbedKernel(WeightRef w, const int32_t* ids, float* out) {
  PdlWait();
  PdlTrigger();
  const int64_t t = blockIdx.x, H = w.cols;
  const int64_t id = ids[t];
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) out[t * H + c] = DecodeWeight(w, id, c);
}

template <typename In, typename Out>
__global__ void RmsNormKernel(RmsNormParams p) {
  __shared__ float scratch[32];
  PdlWait();
  PdlTrigger();
  const int64_t r = blockIdx.x, D = p.dim;
  const int64_t src = p.row_index ? p.row_index[r] : r;
  const In* x = static_cast<const In*>(p.x) + src * (p.x_stride ? p.x_stride : D);
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    float v = LoadF(x + i);
    ss = fmaf(v, v, ss);
  }
  ss = BlockSum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(D) + p.eps);
  Out* out = static_cast<Out*>(p.out) + r * (p.out_stride ? p.out_stride : D);
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    float v = LoadF(x + i) * inv * (p.weight ? p.weight[i] : 1.f);
    if (p.out_f32) p.out_f32[r * D + i] = v;
    StoreF(out + i, v);
  }
}

// Each thread reads back only the elements of s it wrote, so the fused norm needs no barrier
// beyond the block sum's.
template <typename Out>
__global__ void ResidualKernel(ResidualParams p) {
  __shared__ float scratch[32];
  PdlWait();
  PdlTrigger();
  const int64_t r = blockIdx.x, D = p.dim;
  float* s = p.s + r * D;
  const float* o = p.out + r * D;
  if (!p.gated) {
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) s[i] += o[i];
  } else {
    float ss = 0.f;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) ss = fmaf(o[i], o[i], ss);
    ss = BlockSum(ss, scratch);
    const float inv = rsqrtf(ss / static_cast<float>(D) + p.eps);
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
      s[i] = p.alpha[i] * s[i] + p.beta[i] * (o[i] * inv * p.out_norm[i]);
    }
  }
  if (!p.next_out) return;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) ss = fmaf(s[i], s[i], ss);
  ss = BlockSum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(D) + p.eps);
  Out* out = static_cast<Out*>(p.next_out) + r * D;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    const float v = s[i] * inv * (p.next_norm ? p.next_norm[i] : 1.f);
    if (p.next_out_f32) p.next_out_f32[r * D + i] = v;
    StoreF(out + i, v);
  }
}

// One block per token; threads over (head, i < head_dim / 2).
template <typename Act>
__global__ void RopeKernel(RopeParams p) {
  // The token's angles, once per frequency (not once per head): cos and sin of
  // pos / theta^(2i/d) in double, as the CPU reference, kept in shared memory.
  extern __shared__ float cs[];  // [half] cos, then [half] sin
  const int64_t t = blockIdx.x, half = p.head_dim / 2;
  const double pos = p.pos[t];
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const double a = pos / pow(p.theta, static_cast<double>(2 * i) / static_cast<double>(p.head_dim));
    cs[i] = static_cast<float>(cos(a));
    cs[half + i] = static_cast<float>(sin(a));
  }
  __syncthreads();
  Act* x = static_cast<Act*>(p.x) + t * (p.row_stride ? p.row_stride : p.heads * p.head_dim);
  for (int64_t j = threadIdx.x; j < p.heads * half; j += blockDim.x) {
    const int64_t h = j / half, i = j % half;
    const float c = cs[i], s = cs[half + i];
    Act* v = x + h * p.head_dim;
    const float x0 = LoadF(v + i), x1 = LoadF(v + i + half);
    StoreF(v + i, x0 * c - x1 * s);
    StoreF(v + i + half, x1 * c + x0 * s);
  }
}

template <typename In>
cudaError_t LaunchRmsNormIn(const RmsNormParams& p, cudaStream_t st) {
  if (p.out_dtype == ActDType::kF32) return LaunchPdl(RmsNormKernel<In, float>, p.rows, kRowThreads, 0, st, p);
  return LaunchPdl(RmsNormKernel<In, uint16_t>, p.rows, kRowThreads, 0, st, p);
}

}  // namespace

cudaError_t LaunchEmbed(const EmbedParams& p, cudaStream_t st) {
  return LaunchPdl(EmbedKernel, p.num_tokens, kRowThreads, 0, st, p.w, p.ids, p.out);
}

cudaError_t LaunchRmsNorm(const RmsNormParams& p, cudaStream_t st) {
  return p.x_dtype == ActDType::kF32 ? LaunchRmsNormIn<float>(p, st) : LaunchRmsNormIn<uint16_t>(p, st);
}

cudaError_t LaunchResidual(const ResidualParams& p, cudaStream_t st) {
  if (p.next_dtype == ActDType::kF32) return LaunchPdl(ResidualKernel<float>, p.rows, kRowThreads, 0, st, p);
  return LaunchPdl(ResidualKernel<uint16_t>, p.rows, kRowThreads, 0, st, p);
}

cudaError_t LaunchRope(const RopeParams& p, cudaStream_t st) {
  const size_t smem = static_cast<size_t>(p.head_dim) * sizeof(float);  // cos and sin of head_dim / 2 angles
  if (p.dtype == ActDType::kF32) {
    RopeKernel<float><<<p.num_tokens, kRowThreads, smem, st>>>(p);
  } else {
    RopeKernel<uint16_t><<<p.num_tokens, kRowThreads, smem, st>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace moeshard::gpu
