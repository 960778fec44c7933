// The MoE expert step on one GPU: token grouping by expert, fused gate/up projections with
// SiLU gating, the down projection, the optional per-expert RMS norm and the weighted sum
// over each token's slots. moe_params.h states the math; the block comment at the top of
// moe_expert.cc lists the kernels and their order.
//
// Precision. fp32 activations: fp32 arithmetic throughout (no tensor cores, no TF32),
// matching kernels/cpu/moe_ref.h to ~1e-5. bf16 activations: bf16 GEMM inputs with fp32
// accumulation; gate and up results and silu(gate)·up are rounded to bf16 before the down
// GEMM; the down output, the norm and the weighted sum are fp32. The sum over a token's
// slots runs in slot order: results are deterministic, bit for bit, run to run.
//
// Weight formats: all of WeightFormat. NVFP4 experts with bf16 activations take the
// tensor-core path when L and I are multiples of 256 and the views are aligned (16-byte
// aligned rows, col_offset % 32 == 0, even scale strides); it decodes the nibbles and block
// scales exactly, except that a NaN block scale (never in a valid checkpoint) reads as 480.
// Q8_0, MXFP4 and BF16 experts with bf16 activations take the GEMV/mma path (moe_gemv.cu)
// when L and I are multiples of 32, gate and up share a format, and the views sit on the
// 32-column block grid (BF16: 16-byte aligned rows); the block scales are applied in fp32
// to each block's partial sums, BF16 weights feed the tensor cores unchanged. At prefill sizes
// on Hopper (64 rows a local expert on average and more, L % 128 == 0, I % 64 == 0, and a workspace
// sized with the formats) these experts take warpgroup-MMA GEMMs over weights expanded to bf16
// instead (moe_wgmma.cu): there a Q8_0 weight d·q is rounded to bf16 before the product.
// Every other case takes a generic path that honours the WeightRef fully (strides, column
// windows), with fp32 weights on CUDA cores.
//
// Workspace: worst case over routings, T · top_k rows of x (bf16), h (fp32) and the expert
// outputs (fp32): about 2.7 GB for T = 8192, top_k = 8, L = I = 4096; plus 32 MB at any T
// for the streaming kernels' split work items (partial sums); plus, for the wgmma path, the
// local experts' weights in bf16 (MoeExpertWorkspaceBytes).
//
// Ownership: nothing is kept; every pointer in the params (the device expert array too)
// must stay valid until the stream has run the step. Thread-safety: none beyond the
// stream's; the workspace belongs to one call at a time. The first call caches the device's
// SM count and the kernels' occupancy for the process (one kind of GPU per process).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/moe/moe_params.h"

namespace moeshard::gpu {

// Device scratch that MoeExpertStep needs for these sizes (worst case over routings). With the
// experts' formats (MoeExpertFormats) it includes, for prefill-sized steps of Q8_0, MXFP4 or
// BF16 experts on Hopper, room for their weights expanded to bf16 (3 · E · L · I · 2 bytes),
// which the step's wgmma GEMMs need; a smaller workspace keeps the GEMV/mma kernels.
size_t MoeExpertWorkspaceBytes(int num_local_experts, int64_t width, int64_t inter, int64_t num_tokens, int top_k,
                               uint32_t expert_formats = 0);

// MoeExpertParams::expert_formats for these experts, computed once at load. `experts` is a
// HOST array of the same MoeExpertWeights that the device array holds: only formats, sizes,
// column offsets, strides and pointer values are read (for alignment), never the memory.
uint32_t MoeExpertFormats(const MoeExpertWeights* experts, int num_local_experts, int64_t width, int64_t inter);

// Load-time repack of one NVFP4 matrix for the streaming tensor-core kernels
// (moe_nvfp4_stream.cu): reads `src` (device pointers; any row stride, col_offset % 16 == 0,
// rows % 16 == 0, cols % 256 == 0) and writes dst_data (rows · cols / 2 bytes) and dst_scale
// (rows · cols / 16 bytes), both device memory 16-byte aligned, on `stream`. Returns the
// view to store in MoeExpertWeights instead of `src` (same format, sizes and scale2; dense).
// Once every NVFP4 expert's gate, up and down are repacked, set kMoeNvfp4Repacked in
// MoeExpertParams::expert_formats. `src` may be freed once the stream has run the repack.
absl::StatusOr<WeightRef> MoeRepackNvfp4(const WeightRef& src, void* dst_data, void* dst_scale, GpuStream stream);

// The same for an MXFP4 matrix (col_offset % 32 == 0, rows % 16 == 0, cols % 256 == 0), with
// dst_scale rows · cols / 32 bytes (one scale a 32-column block, as stored): the returned view has
// format NVFP4 and scale2 1 and is read by the streaming kernels only when kMoeMxfp4Repacked is set
// beside kMoeNvfp4Repacked. Exact when MoeMxfp4Repackable says so.
absl::StatusOr<WeightRef> MoeRepackMxfp4(const WeightRef& src, void* dst_data, void* dst_scale, GpuStream stream);
// Whether MoeRepackMxfp4 takes each of views[0..n) exactly: its shape qualifies and every e8m0
// block scale is in [2^-124, 2^9]. Reads the scales on the device and synchronizes `stream` once
// (load time only: a layer's views in one call).
absl::StatusOr<bool> MoeMxfp4Repackable(const WeightRef* views, int n, GpuStream stream);

// The same for a Q8_0 matrix (col_offset % 32 == 0, rows % 16 == 0, cols % 256 == 0) into the int8
// streaming layout (moe_q8_stream_layout.h): dst_data rows · cols bytes, dst_scale rows · cols / 16
// bytes. The returned view has format NVFP4 and scale2 2^-8 and is read by the streaming kernels
// only when kMoeQ8Repacked is set beside kMoeNvfp4Repacked. Codes and scales are copied exactly;
// the kernels multiply exact bf16 codes by the activations and scale each 32-column block's
// partial sums by its fp16 d in fp32, as the GEMV kernels over the stored blocks do.
absl::StatusOr<WeightRef> MoeRepackQ8(const WeightRef& src, void* dst_data, void* dst_scale, GpuStream stream);
// Whether MoeRepackQ8 takes this view (its shape and grid; nothing is read).
bool MoeQ8Repackable(const WeightRef& view);

// Enqueues the whole step on `stream`: no allocation, no host synchronization.
// InvalidArgument for bad sizes, null pointers or a short workspace; Internal for a
// failed launch.
absl::Status MoeExpertStep(const MoeExpertParams& p, GpuStream stream);

// The step without its combine, for a caller that mixes the experts' rows itself (the decode
// path does it inside the residual update: kernels/cuda/gpu_params.h ResidualParams::mix_*).
// Token t's slot j output row is rows[pos[t * top_k + j]] (width fp32 values; pos < 0: no
// local expert), to be weighted by p.weights[t * top_k + j] and summed in slot order. Both
// point into p.workspace and hold once the stream has run the step. p.output_norm must be off.
struct MoeExpertRows {
  const float* rows = nullptr;
  const int32_t* pos = nullptr;
};
absl::StatusOr<MoeExpertRows> MoeExpertStepRows(const MoeExpertParams& p, GpuStream stream);

// The step with the MLP block's residual update inside its down kernel, for one token whose experts
// are all on this GPU (a one-stream decode step on one GPU): s[0, L) = (s + pre_add) + Σ_j
// weights[j] · row_j, summed in slot order — the bits of ResidualParams' ungated update (pre_add,
// mix_*) over MoeExpertStepRows' rows; pre_add may be null. s and pre_add are device fp32 rows;
// nothing else is written but the workspace. Returns false, with nothing enqueued, where the step
// does not take it: more than one token, more than 8 slots, experts on other GPUs, the output
// norm, experts not repacked for the direct GEMV (moe_stream_direct_res.cu), or
// MOESHARD_MOE_DOWN_RESIDUAL=0; the caller then runs MoeExpertStepRows and the update.
absl::StatusOr<bool> MoeExpertStepResidual(const MoeExpertParams& p, float* s, const float* pre_add,
                                            GpuStream stream);

// How many steps each expert path has enqueued in this process: host-side counts (relaxed
// atomics, one add a step), for tests and diagnostics — a test run with a path's switch on
// asserts that the path ran. A captured CUDA graph counts once, at capture.
struct MoePathCounts {
  uint64_t steps = 0;          // every MoeExpertStep / MoeExpertStepRows
  uint64_t stream = 0;         // repacked experts (NVFP4, MXFP4 or Q8_0 streaming layouts)
  uint64_t stream_direct = 0;  // of those, the direct GEMV over the streaming layout
  uint64_t direct = 0;         // the direct GEMV over stored blocks (moe_direct.cu)
  uint64_t wgmma = 0;          // the wgmma GEMMs over expanded weights
  uint64_t wgmma_repacked = 0;  // of those, expanded from the streaming layouts (MXFP4, Q8_0)
  uint64_t stream_wgmma = 0;    // repacked NVFP4 / MXFP4 experts through wgmma (moe_stream_wgmma.cu)
  uint64_t stream_split = 0;    // those GEMMs for the experts with many rows, streamed the rest
  uint64_t stream_wgmma_pair = 0;  // of stream_wgmma, the two-CTA 32-token kernel beside the 128-token one
  uint64_t generic = 0;            // the generic kernels (some expert on no fast path)
  uint64_t down_residual = 0;      // MoeExpertStepResidual's steps that took the update inside down
};
MoePathCounts MoeExpertPathCounts();

// Tests: which form the direct GEMV over repacked experts takes, whatever MOESHARD_MOE_DIRECT_WARP
// says — `mask` as that variable (bit 1 down, bit 2 gate/up, bit 4 an expert's pairs one unit; -1:
// the environment's again) — and the warp form's grid at most `max_blocks` blocks (0: one resident
// wave), so that each of its warps walks several units. Every form gives the same bits.
void SetMoeDirectWarpFormForTest(int mask, int max_blocks = 0);

}  // namespace moeshard::gpu
