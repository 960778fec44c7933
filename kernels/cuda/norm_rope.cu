// Per-row kernels of the residual stream: embedding lookup, RMSNorm (optionally gathering
// rows and writing a second fp32 copy), the residual update (plain, or Muse Spark's gated
// form with the output norm fused in) and NeoX RoPE. One block per row; sums of squares
// in fp32 through a block reduction.
#include <cstdint>
#include <cstdlib>

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
// The mixed rows of a row's slots (ResidualParams::mix_*) into shared memory: positions and
// weights of slot j at [j]. Every thread calls it.
__device__ __forceinline__ void LoadMixSlots(const ResidualParams& p, int64_t r, int32_t* pos, float* wt) {
  if (p.mix_rows && threadIdx.x < p.mix_k) {
    pos[threadIdx.x] = p.mix_pos[r * p.mix_k + threadIdx.x];
    wt[threadIdx.x] = p.mix_weights[r * p.mix_k + threadIdx.x];
  }
  __syncthreads();
}

// Element i of the block's output: out's, or the slots' weighted sum in slot order.
__device__ __forceinline__ float OutAt(const ResidualParams& p, const float* o, const int32_t* pos, const float* wt,
                                       int64_t i) {
  if (!p.mix_rows) return o[i];
  float acc = 0.f;
  for (int j = 0; j < p.mix_k; ++j) {
    if (pos[j] >= 0) acc += wt[j] * p.mix_rows[static_cast<int64_t>(pos[j]) * p.dim + i];
  }
  return acc;
}

template <typename Out>
__global__ void ResidualKernel(ResidualParams p) {
  __shared__ float scratch[32];
  __shared__ int32_t mix_pos[64];
  __shared__ float mix_wt[64];
  PdlWait();
  PdlTrigger();
  const int64_t r = blockIdx.x, D = p.dim;
  float* s = p.s + r * D;
  const float* o = p.mix_rows ? nullptr : p.out + r * D;
  LoadMixSlots(p, r, mix_pos, mix_wt);
  if (!p.gated) {
    const float* pre = p.pre_add ? p.pre_add + r * D : nullptr;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
      const float si = pre ? s[i] + pre[i] : s[i];
      s[i] = si + OutAt(p, o, mix_pos, mix_wt, i);
    }
  } else {
    float ss = 0.f;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
      const float oi = OutAt(p, o, mix_pos, mix_wt, i);
      ss = fmaf(oi, oi, ss);
    }
    ss = BlockSum(ss, scratch);
    const float inv = rsqrtf(ss / static_cast<float>(D) + p.eps);
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
      s[i] = p.alpha[i] * s[i] + p.beta[i] * (OutAt(p, o, mix_pos, mix_wt, i) * inv * p.out_norm[i]);
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

// The same update with the row in registers: each thread owns kVec float4 pieces of s and out
// (piece tid + kThreads v), all loaded in one round trip (the weights before PdlWait: they do not
// depend on the kernel before), so a decode row costs one memory round trip and the block sums,
// where the loop above waits on each piece in turn. Same arithmetic per element; the sums of
// squares add each thread's pieces first.
__device__ __forceinline__ float4 Ld4(const float* p, int64_t i, bool ok) {
  return ok ? reinterpret_cast<const float4*>(p)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
}

// The MoE combine of ResidualRegKernel with every slot's row in flight at once (kAllSlots:
// mix_k <= kMaxAllSlots): slot j's row is loaded at its pair index r·k + j — where the direct
// expert kernels leave it (moe_expert.h MoeExpertRows: the rows buffer holds T·k rows) — in the
// same round trip as the slots' positions and weights, instead of the positions first and the
// rows four slots at a time; a slot whose position is elsewhere (the grouped kernels' sorted
// rows) is read again from there. The same sums in the same order as the slot loop.
constexpr int kMaxAllSlots = 8;
template <int kVec, int kThreads>
__device__ __forceinline__ void MixAllSlots(const ResidualParams& p, int64_t r, int64_t D4, float4 (&ov)[kVec]) {
  const int tid = threadIdx.x;
  int32_t pos[kMaxAllSlots];
  float wt[kMaxAllSlots];
  float4 yv[kMaxAllSlots][kVec];
#pragma unroll
  for (int j = 0; j < kMaxAllSlots; ++j) {
    if (j >= p.mix_k) break;
    const int64_t slot = r * p.mix_k + j;
    pos[j] = p.mix_pos[slot];
    wt[j] = p.mix_weights[slot];
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      const int64_t i = tid + int64_t{v} * kThreads;
      yv[j][v] = Ld4(p.mix_rows + slot * p.dim, i, i < D4);
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxAllSlots; ++j) {
    if (j >= p.mix_k) break;
    if (pos[j] < 0) continue;
    if (pos[j] != r * p.mix_k + j) {
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const int64_t i = tid + int64_t{v} * kThreads;
        yv[j][v] = Ld4(p.mix_rows + static_cast<int64_t>(pos[j]) * p.dim, i, i < D4);
      }
    }
    const float w = wt[j];
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      ov[v].x += w * yv[j][v].x;
      ov[v].y += w * yv[j][v].y;
      ov[v].z += w * yv[j][v].z;
      ov[v].w += w * yv[j][v].w;
    }
  }
}

// kThreads: 256, or 1,024 for rows wider than 256 threads' pieces hold (LaunchResidualOut).
template <typename Out, int kVec, bool kGated, bool kAllSlots = false, int kThreads = kRowThreads>
__global__ void __launch_bounds__(kThreads) ResidualRegKernel(ResidualParams p) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x, D4 = p.dim / 4;
  const int tid = threadIdx.x;
  float4 al[kGated ? kVec : 1], be[kGated ? kVec : 1], on[kGated ? kVec : 1], nn[kVec];
#pragma unroll
  for (int v = 0; v < kVec; ++v) {
    const int64_t i = tid + int64_t{v} * kThreads;
    const bool ok = i < D4;
    if constexpr (kGated) {
      al[v] = Ld4(p.alpha, i, ok);
      be[v] = Ld4(p.beta, i, ok);
      on[v] = Ld4(p.out_norm, i, ok);
    }
    nn[v] = p.next_norm ? Ld4(p.next_norm, i, ok) : make_float4(1.f, 1.f, 1.f, 1.f);
  }
  __shared__ int32_t mix_pos[64];
  __shared__ float mix_wt[64];
  PdlWait();
  PdlTrigger();
  float* s = p.s + r * p.dim;
  float4 sv[kVec], ov[kVec];
#pragma unroll
  for (int v = 0; v < kVec; ++v) {
    const int64_t i = tid + int64_t{v} * kThreads;
    sv[v] = Ld4(s, i, i < D4);
    ov[v] = p.mix_rows ? make_float4(0.f, 0.f, 0.f, 0.f) : Ld4(p.out + r * p.dim, i, i < D4);
  }
  if (!kGated && p.pre_add) {  // the previous block's update first (ResidualParams::pre_add)
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      const int64_t i = tid + int64_t{v} * kThreads;
      const float4 a = Ld4(p.pre_add + r * p.dim, i, i < D4);
      sv[v].x += a.x;
      sv[v].y += a.y;
      sv[v].z += a.z;
      sv[v].w += a.w;
    }
  }
  if (kAllSlots && p.mix_rows) {
    MixAllSlots<kVec, kThreads>(p, r, D4, ov);
  } else if (p.mix_rows) {  // the MoE combine: acc += w_j * row_j, slot by slot (as moe_route.cu's)
    LoadMixSlots(p, r, mix_pos, mix_wt);
#pragma unroll 4
    for (int j = 0; j < p.mix_k; ++j) {
      const int32_t row = mix_pos[j];
      if (row < 0) continue;
      const float* y = p.mix_rows + static_cast<int64_t>(row) * p.dim;
      const float w = mix_wt[j];
      float4 yv[kVec];
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const int64_t i = tid + int64_t{v} * kThreads;
        yv[v] = Ld4(y, i, i < D4);
      }
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        ov[v].x += w * yv[v].x;
        ov[v].y += w * yv[v].y;
        ov[v].z += w * yv[v].z;
        ov[v].w += w * yv[v].w;
      }
    }
  }
  MOESHARD_PROBE_MARK(0);  // the row's inputs in registers
  if constexpr (!kGated) {
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      sv[v].x += ov[v].x;
      sv[v].y += ov[v].y;
      sv[v].z += ov[v].z;
      sv[v].w += ov[v].w;
    }
  } else {
    float ss = 0.f;
#pragma unroll
    for (int v = 0; v < kVec; ++v) ss += Sq4(ov[v]);
    ss = BlockSum(ss, scratch);
    const float inv = rsqrtf(ss / static_cast<float>(p.dim) + p.eps);
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      sv[v].x = al[v].x * sv[v].x + be[v].x * (ov[v].x * inv * on[v].x);
      sv[v].y = al[v].y * sv[v].y + be[v].y * (ov[v].y * inv * on[v].y);
      sv[v].z = al[v].z * sv[v].z + be[v].z * (ov[v].z * inv * on[v].z);
      sv[v].w = al[v].w * sv[v].w + be[v].w * (ov[v].w * inv * on[v].w);
    }
  }
#pragma unroll
  for (int v = 0; v < kVec; ++v) {
    const int64_t i = tid + int64_t{v} * kThreads;
    if (i < D4) reinterpret_cast<float4*>(s)[i] = sv[v];
  }
  MOESHARD_PROBE_MARK(1);  // s stored
  if (!p.next_out) return;
  float ss = 0.f;
#pragma unroll
  for (int v = 0; v < kVec; ++v) ss += Sq4(sv[v]);
  ss = BlockSum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(p.dim) + p.eps);
  Out* out = static_cast<Out*>(p.next_out) + r * p.dim;
#pragma unroll
  for (int v = 0; v < kVec; ++v) {
    const int64_t i = tid + int64_t{v} * kThreads;
    if (i >= D4) continue;
    const float4 y = make_float4(sv[v].x * inv * nn[v].x, sv[v].y * inv * nn[v].y, sv[v].z * inv * nn[v].z,
                                 sv[v].w * inv * nn[v].w);
    if (p.next_out_f32) reinterpret_cast<float4*>(p.next_out_f32 + r * p.dim)[i] = y;
    if constexpr (sizeof(Out) == 4) {
      reinterpret_cast<float4*>(out)[i] = y;
    } else {
      const uint2 b = PackBf16x4(y);
      reinterpret_cast<uint2*>(out)[i] = b;
    }
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

template <typename Out>
cudaError_t LaunchResidualOut(const ResidualParams& p, cudaStream_t st) {
  const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  const int64_t pieces = (p.dim / 4 + kRowThreads - 1) / kRowThreads;
  const bool reg = p.dim % 4 == 0 && pieces <= 8 && aligned(p.s) &&
                   (p.mix_rows ? aligned(p.mix_rows) : aligned(p.out)) &&
                   (!p.gated || (aligned(p.alpha) && aligned(p.beta) && aligned(p.out_norm))) &&
                   (!p.next_norm || aligned(p.next_norm)) && (!p.next_out_f32 || aligned(p.next_out_f32)) &&
                   (!p.pre_add || aligned(p.pre_add)) && (!p.next_out || aligned(p.next_out));
  // MOESHARD_RESIDUAL_ALL_SLOTS=0: the combine's rows four slots at a time after the positions.
  static const bool all_slots_on = [] {
    const char* v = std::getenv("MOESHARD_RESIDUAL_ALL_SLOTS");
    return !(v && v[0] == '0');
  }();
  // Only decode-sized steps: there the direct expert kernels leave slot j's row at r·k + j, while a
  // prefill's grouped kernels sort the rows by expert, so every early load would be wasted and
  // read again (268 MB a 4,096-token layer of the Qwen3-30B shape: 160 µs against ~85).
  const bool all_slots =
      all_slots_on && p.mix_rows && p.mix_k <= kMaxAllSlots && p.rows * p.mix_k <= kMoePairOrderMaxPairs;
  // Rows of 4,097-8,192 (Muse Spark's 8,192): 1,024 threads of two pieces each, one round trip for
  // the row. The gated form's 256 threads would hold 8 pieces and three weight rows, so it took the
  // loop kernel below, which waits on each element's slot rows in turn (ncu, H100, 2026-12-06, one
  // decode token of Muse Spark: 52 and 37 µs for the layer's two updates, ~20 % of the step; 6.2
  // and 5.6 µs in this form, the 8-layer decode step 4.50-4.57 -> 3.73-3.74 ms). Gated rows take it
  // by default; ungated rows keep the 256-thread kernel of 8 pieces (no spill there, and its sums
  // group as the GEMV's folded update does, gemv.h GemvResidualIn). MOESHARD_RESIDUAL_WIDE=0: never,
  // =1: ungated rows too.
  static const int wide_mode = [] {
    const char* v = std::getenv("MOESHARD_RESIDUAL_WIDE");
    if (v && v[0] == '0') return 0;
    return v && v[0] == '1' ? 2 : 1;
  }();
  constexpr int kWide = 1024;
  // (The combine's slots four at a time: every slot's row in flight at once spilled at 1,024
  // threads' 64 registers.)
  const bool wide = wide_mode == 2 || (wide_mode == 1 && p.gated);
  if (reg && wide && pieces > 4 && (p.dim / 4 + kWide - 1) / kWide <= 2) {
    if (p.gated) return LaunchPdl(ResidualRegKernel<Out, 2, true, false, kWide>, p.rows, kWide, 0, st, p);
    return LaunchPdl(ResidualRegKernel<Out, 2, false, false, kWide>, p.rows, kWide, 0, st, p);
  }
  // The gated form holds three more weight rows: registers for up to 4 pieces a thread.
  if (!reg || (p.gated && pieces > 4)) return LaunchPdl(ResidualKernel<Out>, p.rows, kRowThreads, 0, st, p);
  if (all_slots && pieces <= 2) {
    if (p.gated) return LaunchPdl(ResidualRegKernel<Out, 2, true, true>, p.rows, kRowThreads, 0, st, p);
    return LaunchPdl(ResidualRegKernel<Out, 2, false, true>, p.rows, kRowThreads, 0, st, p);
  }
  if (p.gated) {
    if (pieces <= 2) return LaunchPdl(ResidualRegKernel<Out, 2, true>, p.rows, kRowThreads, 0, st, p);
    return LaunchPdl(ResidualRegKernel<Out, 4, true>, p.rows, kRowThreads, 0, st, p);
  }
  if (pieces <= 2) return LaunchPdl(ResidualRegKernel<Out, 2, false>, p.rows, kRowThreads, 0, st, p);
  if (pieces <= 4) return LaunchPdl(ResidualRegKernel<Out, 4, false>, p.rows, kRowThreads, 0, st, p);
  return LaunchPdl(ResidualRegKernel<Out, 8, false>, p.rows, kRowThreads, 0, st, p);
}

cudaError_t LaunchResidual(const ResidualParams& p, cudaStream_t st) {
  static const bool reg_off = [] {
    const char* v = std::getenv("MOESHARD_RESIDUAL_REG");
    return v && v[0] == '0';
  }();
  if (reg_off) {
    if (p.next_dtype == ActDType::kF32) return LaunchPdl(ResidualKernel<float>, p.rows, kRowThreads, 0, st, p);
    return LaunchPdl(ResidualKernel<uint16_t>, p.rows, kRowThreads, 0, st, p);
  }
  return p.next_dtype == ActDType::kF32 ? LaunchResidualOut<float>(p, st) : LaunchResidualOut<uint16_t>(p, st);
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
