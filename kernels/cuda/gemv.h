// Decode-sized dense projections: y[T, N] = x[T, K] · Wᵀ (+ bias) for T ≤ kGemvMaxTokens, read
// at memory speed. One launch can run up to three matrices that share x and K (the attention
// block's Q, K and V), so a decode layer spends one kernel on them instead of three cuBLAS calls.
//
// Weights stay compact: besides bf16 and fp32 rows, the "split Q8" layout holds a Q8_0 matrix as
// int8 codes [N, K] (16-byte loads, no 34-byte blocks to straddle) and one f16 scale per 32
// codes [N, K / 32]: the same 8.5 bits per weight as Q8_0, half of bf16. GemvSplitQ8 converts a
// stored Q8_0 view to it once at load; GemvExpandQ8 writes the bf16 rows (for the tensor-core
// GEMMs of prefill) bit for bit as ExpandWeights does from the Q8_0 bytes.
//
// Arithmetic: weights decoded exactly to fp32 (int8 × f16 scale per 32-block, applied to the
// block's fp32 partial sum), activations as fp32, fp32 accumulation; outputs rounded once.
// All calls enqueue on `stream` and do not synchronize.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/gpu_params.h"

namespace moeshard::gpu {

inline constexpr int64_t kGemvMaxTokens = 8;
// Split Q8 weights with bf16 x (no residual input) take up to this many tokens in one launch
// (gemv_wide.cu, K a multiple of 64): the weights decoded once for all of them.
inline constexpr int64_t kGemvWideMaxTokens = 64;

enum class GemvWeight : uint8_t { kF32, kBF16, kQ8 };

struct GemvMatrix {
  const void* w = nullptr;           // [rows, K]: float, bf16 bits, or int8 codes (kQ8)
  const uint16_t* scales = nullptr;  // kQ8 only: f16 bits [rows, K / 32]
  int64_t rows = 0;
  const float* bias = nullptr;  // optional [rows]
  void* y = nullptr;            // [T, y_stride] of y_dtype
  int64_t y_stride = 0;         // elements; 0 means rows
};

// Optional x of a launch: the previous block's residual update and this block's input norm,
// folded in — x[t] = rmsnorm(s[t] + add[t]) ⊙ norm, each row's sum of squares and rounding exactly
// as the residual kernel's (norm_rope.cu ResidualRegKernel: 256 threads, float4 pieces; not its
// 1,024-thread form, whose sums group otherwise and which plain rows past 4,096 take only under
// MOESHARD_RESIDUAL_WIDE=1). Every block computes the rows itself; block 0 also writes x as `xn`
// (act dtype) for the kernels after it. s is not written: the next residual update adds `add`
// first (ResidualParams::pre_add). Without `add`, x = rmsnorm(s) ⊙ norm: the next block's norm of an
// update that a kernel before already stored in s (moe_expert.h MoeExpertStepResidual).
struct GemvResidualIn {
  const float* s = nullptr;     // [T, K] fp32; null: x as given
  const float* add = nullptr;   // optional [T, K]
  const float* norm = nullptr;  // [K]
  float eps = 1e-6f;
  void* xn = nullptr;  // optional [T, K]
  ActDType xn_dtype = ActDType::kBF16;
  // x rounded to bf16 before the products, as the GEMV reads a bf16 xn (the Q/K/V projections),
  // where the router reads its fp32 copy.
  bool round_x = false;
  // The norm's weights staged into x's shared memory before the kernel's wait (weights: pdl.cuh rule
  // 1), so that the prologue's second pass waits on no load; else loaded after the norm's block sum.
  bool norm_early = false;
};

struct GemvParams {
  GemvWeight wtype = GemvWeight::kBF16;
  const void* x = nullptr;  // [T, x_stride] of x_dtype
  ActDType x_dtype = ActDType::kBF16;
  int64_t x_stride = 0;  // elements; 0 means cols
  ActDType y_dtype = ActDType::kF32;
  int64_t cols = 0;        // K: a multiple of 16 (32 for kQ8)
  int64_t num_tokens = 0;  // 1..kGemvMaxTokens; up to kGemvWideMaxTokens where GemvWideTakes
  GemvMatrix m[3];
  int num_matrices = 1;
  GemvResidualIn res;  // res.s set: x, x_dtype and x_stride are not read
};

// Whether Gemv takes this weight shape (K) and alignment; callers fall back to a GEMM otherwise.
bool GemvSupports(GemvWeight wtype, int64_t cols);
// Whether `tokens` rows of x fit one launch (each launch reads the weights once): fp32 x in
// shared memory, whatever the weights.
bool GemvOneLaunch(int64_t cols, int64_t tokens);
// The same for these weights and this x: split Q8 weights with bf16 x count what the tensor-core
// kernel holds (bf16 x: 8 tokens at K = 4,096), so a 5-8-row batch's O projection of the
// Qwen3-30B shape is one launch instead of cuBLAS on an expanded copy (the runner's UseGemv) or
// two launches (Gemv's grouping): 3-7 % off bench-model's 8-64-stream steps on the H200
// (docs/PERFORMANCE.md, 2026-12-04). MOESHARD_GEMV_MMA_GROUP8=0: the fp32-x count, as before.
bool GemvOneLaunch(GemvWeight wtype, ActDType x_dtype, int64_t cols, int64_t tokens);
absl::Status Gemv(const GemvParams& p, GpuStream stream);
// Whether Gemv runs `tokens` (more than kGemvMaxTokens) rows of these weights and x in one launch
// of the wide kernel (gemv_wide.cu; MOESHARD_GEMV_WIDE=0 off): split Q8, bf16 x, K % 64 == 0,
// at most kGemvWideMaxTokens.
bool GemvWideTakes(GemvWeight wtype, bool x_f32, int64_t cols, int64_t tokens);

// Q8_0 view (device pointers) → int8 codes [rows, cols] + f16 scales [rows, cols / 32].
absl::Status GemvSplitQ8(const WeightRef& q8_0, int8_t* codes, uint16_t* scales, GpuStream stream);
// Split Q8 rows [0, rows) → out[rows, cols] as bf16 or fp32 (exactly ExpandWeights' values).
absl::Status GemvExpandQ8(const int8_t* codes, const uint16_t* scales, int64_t rows, int64_t cols, void* out,
                          ActDType out_dtype, GpuStream stream);

}  // namespace moeshard::gpu
