// Plain parameter structs of the MoE expert step: device pointers and sizes only. Free of
// CUDA and Abseil headers so that the .cu files (C++17), host code and tests include it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/weight_ref.h"
#include "kernels/cuda/gpu_params.h"

#if defined(__CUDACC__)
#define MOESHARD_MOE_HD __host__ __device__ __forceinline__
#else
#define MOESHARD_MOE_HD inline
#endif

namespace moeshard::gpu {

// One expert's SwiGLU weights; every pointer inside is a device pointer.
struct MoeExpertWeights {
  WeightRef gate, up;  // [I, L]
  WeightRef down;      // [L, I]
};

// One GPU's share of an MoE layer: its local experts applied to all T tokens.
//   out[t] = Σ_k weights[t,k] · norm?(down_e(silu(gate_e·x_t) ⊙ up_e·x_t)),  e = expert_ids[t,k]
// summed over the slots k in order 0..top_k-1; rows with no local expert are zero.
struct MoeExpertParams {
  const MoeExpertWeights* experts = nullptr;  // DEVICE array [num_local_experts]
  int num_local_experts = 0;
  // Optional: the layer's experts on all GPUs (0: num_local_experts). The host's estimate of this
  // GPU's share of the pairs (T · top_k · local / total) chooses between kernels of equal results.
  int num_total_experts = 0;
  int64_t width = 0;  // L: input and output width
  int64_t inter = 0;  // I: gate/up output width
  int64_t num_tokens = 0;
  int top_k = 0;
  const int32_t* expert_ids = nullptr;  // device [T, top_k]: local index, or -1 (another GPU's)
  const float* weights = nullptr;       // device [T, top_k]
  const void* x = nullptr;              // device [T, L], act_dtype
  ActDType act_dtype = ActDType::kF32;
  bool output_norm = false;  // weight-free RMSNorm of each expert's output over L (Muse Spark)
  float eps = 1e-5f;
  float* out = nullptr;       // device [T, L] fp32, overwritten
  // Optional device [T, L] bf16 (act_dtype must be kBF16): `out` rounded to nearest even, written
  // by the combine beside it, so that a caller that needs the mix in the activation dtype (Muse
  // Spark's latent_out GEMV) launches no conversion of its own.
  void* out_act = nullptr;
  void* workspace = nullptr;  // device, MoeExpertWorkspaceBytes(...) bytes, 256-byte aligned
  size_t workspace_bytes = 0;
  // Optional, filled by the caller once at load with MoeExpertFormats (moe_expert.h): bit
  // MoeFormatBit(f) for every format among the local experts' gate, up and down views, plus
  // kMoeAllViewsFast when every local expert's views qualify for a bf16 fast path. Lets the
  // step skip the launches that no expert needs (the generic ones, ~16 us per step, when all
  // experts are fast-eligible and act_dtype is kBF16). 0 (default): unknown, every path is
  // launched as before. A wrong value (a format missing, or kMoeAllViewsFast set for an
  // ineligible expert) leaves that expert's rows uncomputed.
  uint32_t expert_formats = 0;
};

MOESHARD_MOE_HD constexpr uint32_t MoeFormatBit(WeightFormat f) { return 1u << static_cast<unsigned>(f); }
constexpr uint32_t kMoeAllViewsFast = 1u << 31;
// Set by the caller (with the format bits, computed from the repacked views) when every NVFP4
// expert view was made by MoeRepackNvfp4, MoeRepackMxfp4 or MoeRepackQ8 (moe_expert.h): the
// step then streams them through the repacked kernels.
// Repacked views are readable by these kernels only (not the generic path, not the CPU
// reference), so each of them must also pass MoeNvfp4Eligible, and the step needs bf16
// activations (MoeExpertStep rejects anything else).
constexpr uint32_t kMoeNvfp4Repacked = 1u << 30;
// Set with kMoeNvfp4Repacked when the repacked views came from MXFP4 weights (MoeRepackMxfp4:
// NVFP4-format views whose scale bytes are e8m0 exponents); every expert of the layer alike.
constexpr uint32_t kMoeMxfp4Repacked = 1u << 29;
// Set with kMoeNvfp4Repacked when the repacked views came from Q8_0 weights (MoeRepackQ8:
// NVFP4-format views over int8 codes and fp16 scales); every expert of the layer alike.
constexpr uint32_t kMoeQ8Repacked = 1u << 28;
// The hint's bits that are not weight formats.
constexpr uint32_t kMoeHintFlags = kMoeAllViewsFast | kMoeNvfp4Repacked | kMoeMxfp4Repacked | kMoeQ8Repacked;

// The NVFP4 tensor-core path (moe_nvfp4.cu) takes this view [rows, cols] (with bf16
// activations, L and I multiples of 256 and x 16-byte aligned).
MOESHARD_MOE_HD bool MoeNvfp4EligibleRef(const WeightRef& w, int64_t rows, int64_t cols) {
  if (w.format != WeightFormat::kNVFP4 || w.rows != rows || w.cols != cols) return false;
  if (cols % 256 != 0 || rows % 16 != 0 || w.col_offset % 32 != 0) return false;
  if (w.row_stride_bytes % 16 != 0 || w.scale_row_stride % 2 != 0) return false;
  const uintptr_t d = reinterpret_cast<uintptr_t>(w.data + w.col_offset / 2);
  const uintptr_t s = reinterpret_cast<uintptr_t>(w.scale + w.col_offset / 16);
  return d % 16 == 0 && s % 2 == 0;
}

MOESHARD_MOE_HD bool MoeNvfp4Eligible(const MoeExpertWeights& e, int64_t L, int64_t I) {
  return MoeNvfp4EligibleRef(e.gate, I, L) && MoeNvfp4EligibleRef(e.up, I, L) && MoeNvfp4EligibleRef(e.down, L, I);
}

// The bf16 GEMV/mma path (moe_gemv.cu) takes this view [rows, cols]: Q8_0 or MXFP4 on the
// 32-column block grid (any row stride or alignment: rows are staged through shared memory),
// or BF16 with 16-byte aligned rows. cols (L or I) must be a multiple of 32.
MOESHARD_MOE_HD bool MoeGemvEligibleRef(const WeightRef& w, int64_t rows, int64_t cols) {
  if (w.rows != rows || w.cols != cols || cols % 32 != 0 || rows % 32 != 0 || w.col_offset < 0) return false;
  switch (w.format) {
    case WeightFormat::kQ8_0:
    case WeightFormat::kMXFP4:
      return w.col_offset % 32 == 0;
    case WeightFormat::kBF16:
      return (reinterpret_cast<uintptr_t>(w.data) + 2 * static_cast<uintptr_t>(w.col_offset)) % 16 == 0 &&
             w.row_stride_bytes % 16 == 0;
    default:
      return false;
  }
}

// gate and up share a format (they are decoded together); down's may differ.
MOESHARD_MOE_HD bool MoeGemvEligible(const MoeExpertWeights& e, int64_t L, int64_t I) {
  return e.gate.format == e.up.format && MoeGemvEligibleRef(e.gate, I, L) && MoeGemvEligibleRef(e.up, I, L) &&
         MoeGemvEligibleRef(e.down, L, I);
}

}  // namespace moeshard::gpu
