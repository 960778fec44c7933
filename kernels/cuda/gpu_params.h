// Plain parameter structs of the CUDA kernels: device pointers, strides and sizes only.
// Free of CUDA and Abseil headers so that .cu files, host code and tests all include it.
#pragma once

#include <cstdint>

#include "kernels/cpu/weight_ref.h"

struct CUstream_st;  // what cudaStream_t points to

namespace moeshard::gpu {

using GpuStream = CUstream_st*;  // nullptr: the legacy default stream

enum class ActDType : uint8_t { kF32, kBF16 };

// The most (token, slot) pairs of an MoE step whose rows come back in pair order: row t·k + j at
// index t·k + j (the direct decode kernels, kernels/moe/moe_launch.h kMoeDirectMaxPairs). The
// residual update's combine loads rows at that index before it knows their positions only for
// steps this small (norm_rope.cu).
inline constexpr int64_t kMoePairOrderMaxPairs = 64;

// Expands every row of `w` (a WeightRef whose `data` and `scale` point to device memory)
// into out[rows, out_row_stride] as float32 or bf16 (round to nearest even of the fp32 value).
struct ExpandParams {
  WeightRef w;
  void* out = nullptr;
  int64_t out_row_stride = 0;  // elements; 0 means w.cols
  ActDType out_dtype = ActDType::kF32;
};

// y[T, w.rows] = x[T, w.cols] · Wᵀ (+ bias[w.rows]), fp32 accumulation. x and y share the
// activation dtype; `w` points to device memory in its stored format.
struct MatMulParams {
  WeightRef w;
  const void* x = nullptr;
  int64_t x_row_stride = 0;  // elements; 0 means w.cols
  void* y = nullptr;
  int64_t y_row_stride = 0;  // elements; 0 means w.rows
  int64_t num_tokens = 0;
  ActDType act_dtype = ActDType::kF32;
  const float* bias = nullptr;  // device, optional
};

}  // namespace moeshard::gpu

namespace moeshard::gpu {

// ---- Model ops (kernels/cuda/norm_rope.cu, attention.cu, routing.cu, elementwise.cu) ----

enum class KvElem : uint8_t { kF32, kBF16, kFp8E4M3 };

// A paged KV cache of one layer: position p of a sequence lives in block
// table[p / block_size], slot p % block_size; each slot holds [num_kv_heads, head_dim].
// FP8 stores each (slot, head) vector scaled by its own fp32 scale (amax / 448).
struct KvCacheView {
  void* k = nullptr;
  void* v = nullptr;             // [num_blocks, block_size, num_kv_heads, head_dim]
  float* k_scale = nullptr;      // FP8 only: [num_blocks, block_size, num_kv_heads]
  float* v_scale = nullptr;
  KvElem elem = KvElem::kF32;
  int64_t block_size = 0, num_kv_heads = 0, head_dim = 0;
  // Blocks k and v hold (0: not said; the long-context decode kernel, which reads the cache
  // through tensor maps that need its extent, then leaves the call to another kernel).
  int64_t num_blocks = 0;
};

// An FP8 cache's blocks src_blocks[i] (i < num_blocks) dequantized to bf16 block i of k_out /
// v_out ([num_blocks, block_size, num_kv_heads, head_dim]): value x scale of its (slot, head), the
// arithmetic of the tensor-core prefill kernel's FP8 tiles (e4m3 -> fp16 -> fp32, x scale, round to
// bf16), so attention over the copy equals attention over the FP8 cache.
struct KvDequantParams {
  KvCacheView src;
  const int32_t* src_blocks = nullptr;
  int64_t num_blocks = 0;
  void* k_out = nullptr;
  void* v_out = nullptr;
};

// out[t, :] = row ids[t] of w, decoded to fp32 (the residual stream).
struct EmbedParams {
  WeightRef w;
  const int32_t* ids = nullptr;
  int64_t num_tokens = 0;
  float* out = nullptr;
};

// out[r] = x[src(r)] / sqrt(mean(x²) + eps) ⊙ weight, src(r) = row_index ? row_index[r] : r.
// Sum of squares in fp32; `out_f32` optionally receives the same rows in fp32.
struct RmsNormParams {
  const void* x = nullptr;
  ActDType x_dtype = ActDType::kF32;
  int64_t x_stride = 0;  // elements; 0 means dim
  const int32_t* row_index = nullptr;
  int64_t rows = 0, dim = 0;
  const float* weight = nullptr;  // optional
  float eps = 1e-6f;
  void* out = nullptr;            // may alias x (same dtype and stride)
  ActDType out_dtype = ActDType::kF32;
  int64_t out_stride = 0;
  float* out_f32 = nullptr;       // optional, [rows, dim]
};

// Plain: s += out. Gated (Muse Spark): s = alpha ⊙ s + beta ⊙ (rmsnorm(out) ⊙ out_norm).
// With next_out set, also the next block's input: next_out = rmsnorm(s) ⊙ next_norm (as
// RmsNormParams computes it, from the updated fp32 s), plus an optional fp32 copy.
struct ResidualParams {
  float* s = nullptr;
  const float* out = nullptr;
  int64_t rows = 0, dim = 0;
  bool gated = false;
  const float *out_norm = nullptr, *alpha = nullptr, *beta = nullptr;
  float eps = 1e-6f;
  const float* next_norm = nullptr;  // optional weight of the fused norm
  void* next_out = nullptr;
  ActDType next_dtype = ActDType::kF32;
  float* next_out_f32 = nullptr;
  // Optional, instead of `out` (the MoE combine fused in): row t's output is
  // sum_j mix_weights[t * mix_k + j] * mix_rows[mix_pos[t * mix_k + j] * dim ...], in slot order,
  // a slot with mix_pos < 0 skipped (moe_expert.h MoeExpertStepRows). mix_k <= 64. mix_rows holds
  // at least rows * mix_k rows: the update may read slot t * mix_k + j's row at that index before
  // it knows the slot's position (norm_rope.cu MixAllSlots; MoeExpertRows' buffer has T * k).
  const float* mix_rows = nullptr;
  const int32_t* mix_pos = nullptr;
  const float* mix_weights = nullptr;
  int mix_k = 0;
  // Optional, ungated only: added to s first, s = (s + pre_add) + out — the previous block's
  // residual update, left to this one when the kernels between computed its norm themselves
  // (GemvResidualIn): the same fp32 additions in the same order.
  const float* pre_add = nullptr;
};

// NeoX rotate-half RoPE in place on x[T, heads, head_dim] (rows `row_stride` apart).
struct RopeParams {
  void* x = nullptr;
  ActDType dtype = ActDType::kF32;
  int64_t num_tokens = 0, heads = 0, head_dim = 0, row_stride = 0;
  const int32_t* pos = nullptr;
  double theta = 10000.0;
};

// Stores k/v [T, num_kv_heads, head_dim] of token t at cache slot slots[t]
// (block * block_size + offset).
struct KvWriteParams {
  const void *k = nullptr, *v = nullptr;
  ActDType dtype = ActDType::kF32;
  int64_t k_stride = 0, v_stride = 0;  // elements per token; 0 means num_kv_heads * head_dim
  int64_t num_tokens = 0;
  const int32_t* slots = nullptr;
  KvCacheView cache;
};

// The attention block's per-head steps between the QKV projection and attention, in one
// launch: each query and key head optionally RMS-normalized (q_norm / k_norm weights over
// head_dim, eps), then NeoX RoPE at pos[t] when `rope`; q written back in place, k and v
// stored into the cache at slots[t] as KvWrite does. fp32 throughout (one rounding to the
// activation dtype for q, one to the cache element for k and v). head_dim a multiple of 64,
// at most 256; other shapes take the separate kernels.
struct QkPrepParams {
  void* q = nullptr;
  const void *k = nullptr, *v = nullptr;
  ActDType dtype = ActDType::kF32;
  int64_t num_tokens = 0, num_heads = 0;
  const float *q_norm = nullptr, *k_norm = nullptr;  // both or neither
  float eps = 1e-6f;
  bool rope = false;
  const int32_t* pos = nullptr;
  double theta = 10000.0;
  const int32_t* slots = nullptr;
  KvCacheView cache;  // num_kv_heads and head_dim come from here
};

// Which attention kernel runs (kernels/cuda/attention*.cu). kAuto picks one from the shape:
// kSplitDecode when every sequence contributes few tokens (max_tokens_per_seq, or
// num_tokens when that is unknown, at most 8), kWgmma for other batches it can run (an sm_90
// device, bf16 activations and cache, head_dim 64 or 128, query heads per KV head dividing 128;
// MOESHARD_ATTN_WGMMA=0 leaves it out), kTiledTensorCore for other bf16 batches
// with head_dim <= 128, kTiled otherwise, and kReference where
// neither applies (head_dim not a multiple of 4 or above 256, more than 64 query heads per
// KV head, or a cache pointer not 16-byte aligned). Forcing one that cannot run the shape
// is an InvalidArgument error.
enum class AttentionAlgo : uint8_t {
  kAuto,
  kReference,   // one block per (token, query head); the first version, kept as a fallback
  kTiled,       // flash-attention-2 style: one CTA per (query tile, KV head), all GQA heads
  kSplitDecode, // per (token, KV head, key split), partials merged by a combine kernel
  kTiledTensorCore,  // kTiled on mma.sync bf16 tensor cores: bf16 activations, head_dim <= 128
  kWgmma  // FA3-style on Hopper's wgmma (sm_90a): bf16 activations and cache, head_dim 64 or 128
};

// Causal paged attention for a ragged batch: token t (at position pos[t], its sequence's
// block table at block_tables + table_offset[t]) attends to positions
// [max(0, pos - window + 1), pos] of its sequence (window 0: all). GQA: query head h reads
// KV head h / (num_heads / num_kv_heads). Online softmax in fp32; no score matrix.
// Tokens sharing one table_offset must belong to one sequence (the tiled kernel shares
// K/V reads among consecutive tokens with the same table_offset).
struct AttentionParams {
  const void* q = nullptr;
  void* out = nullptr;
  ActDType dtype = ActDType::kF32;
  int64_t q_stride = 0, out_stride = 0;  // elements per token; 0 means num_heads * head_dim
  int64_t num_tokens = 0, num_heads = 0;
  const int32_t* pos = nullptr;
  const int32_t* table_offset = nullptr;
  const int32_t* block_tables = nullptr;
  int64_t window = 0;
  float scale = 1.f;
  KvCacheView cache;
  // Optional (additive; the defaults keep the first behaviour correct):
  // the most tokens any one sequence has in this batch (1 for pure decode); 0: unknown.
  int64_t max_tokens_per_seq = 0;
  // Device scratch for the split-decode partials, AttentionWorkspaceBytes() bytes
  // (gpu_ops.h); without it the split-decode kernel runs one split per (token, KV head).
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  AttentionAlgo algo = AttentionAlgo::kAuto;
  // Split decode: the fewest keys a split takes (a multiple of 32, >= 64); set by the launcher
  // (MOESHARD_ATTN_SPLIT_KEYS), so short contexts use fewer, fuller splits and a smaller combine.
  int64_t split_min_keys = 64;
};

// Top-k of each token's fp32 router logits (ties to the lower index), weights as
// kernels/cpu TopKRouting, ids made local: id - expert_begin, or -1 outside
// [expert_begin, expert_begin + num_local_experts).
struct RoutingParams {
  const float* logits = nullptr;
  int64_t num_tokens = 0, num_experts = 0, top_k = 0;
  bool softmax_topk_only = false, renormalize = false;
  int64_t expert_begin = 0, num_local_experts = 0;
  int32_t* local_ids = nullptr;
  float* weights = nullptr;
  int32_t* global_ids = nullptr;  // optional
};

// out = silu(gate) ⊙ up, elementwise over n values (fp32 math).
struct SiluMulParams {
  const void *gate = nullptr, *up = nullptr;
  void* out = nullptr;
  ActDType dtype = ActDType::kF32;
  int64_t n = 0;
};

// o[t, h, :] *= sigmoid(gate[t, h]) (Muse Spark's per-head output gate).
struct HeadGateParams {
  void* o = nullptr;
  const void* gate = nullptr;
  ActDType dtype = ActDType::kF32;
  int64_t num_tokens = 0, heads = 0, head_dim = 0;
};

// y[r, c] += bias[c]; y in `dtype`.
struct AddBiasParams {
  void* y = nullptr;
  ActDType dtype = ActDType::kF32;
  const float* bias = nullptr;
  int64_t rows = 0, cols = 0;
};

// y = x converted (fp32 <-> bf16, round to nearest even).
struct ConvertParams {
  const void* x = nullptr;
  ActDType x_dtype = ActDType::kF32;
  void* y = nullptr;
  ActDType y_dtype = ActDType::kF32;
  int64_t n = 0;
};

}  // namespace moeshard::gpu

namespace moeshard::gpu {

// Synthetic weights written on the device (benchmarks of shapes too large to store):
// a counter-based hash of (seed, index) gives every element, so results do not depend on
// the launch shape.
enum class FillKind : uint8_t {
  kRandomBytes,   // dst[i] = hash byte
  kUniformF32,    // dst[i] = scale * U(-1, 1), float
  kUniformBf16,   // the same, stored as bf16
  kConstF32,      // dst[i] = scale
  kStridedU16,    // at every `stride` bytes: the uint16 `pattern` (Q8_0 block scales)
  kStridedU8,     // at every `stride` bytes: the byte `pattern` (MXFP4 block scales)
};

struct FillParams {
  void* dst = nullptr;
  int64_t count = 0;   // elements (bytes for kRandomBytes, blocks for the strided kinds)
  FillKind kind = FillKind::kRandomBytes;
  float scale = 1.f;
  uint64_t seed = 0;
  int64_t stride = 0;
  uint32_t pattern = 0;
};

// The most ranges the split-decode attention cuts one (token, KV head)'s keys into.
inline constexpr int64_t kAttentionMaxSplits = 128;

// The greedy token of each of `rows` rows of fp32 logits [rows, vocab]: worker/sampler.h's ArgMax.
// partial_value / partial_index: device scratch of rows * kArgMaxSplits each (gpu_ops.h ArgMaxBytes
// covers both).
inline constexpr int kArgMaxSplits = 32;
struct ArgMaxParams {
  const float* logits = nullptr;
  int64_t rows = 0;
  int64_t vocab = 0;
  float* partial_value = nullptr;
  int64_t* partial_index = nullptr;
  int32_t* out = nullptr;  // [rows]
};

}  // namespace moeshard::gpu
