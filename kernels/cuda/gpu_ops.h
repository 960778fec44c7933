// Host entry points of the CUDA kernels. Each call validates its params, enqueues work on
// `stream` and returns without synchronizing; errors name the CUDA call that failed.
// Thread-safe as far as the stream is: callers serialize work on one stream themselves.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/gpu_params.h"

namespace moeshard::gpu {

// Row expansion of stored weights: bit-exact with kernels/cpu/dequant.h DequantRow in fp32.
absl::Status ExpandWeights(const ExpandParams& p, GpuStream stream);

// Tiled matmul that reads weights in their stored format and expands them on chip.
absl::Status MatMul(const MatMulParams& p, GpuStream stream);

// The model's per-token ops; params in gpu_params.h, CPU references in kernels/cpu/ops.h.
absl::Status Embed(const EmbedParams& p, GpuStream stream);
absl::Status RmsNorm(const RmsNormParams& p, GpuStream stream);
absl::Status Residual(const ResidualParams& p, GpuStream stream);
absl::Status Rope(const RopeParams& p, GpuStream stream);
absl::Status KvWrite(const KvWriteParams& p, GpuStream stream);
// KvDequantParams: an FP8 cache's blocks as a bf16 copy (the FP8 prefill path of the GPU runner).
absl::Status KvDequant(const KvDequantParams& p, GpuStream stream);
// q/k norm + RoPE + KV write in one launch; QkPrepSupports says whether the shape qualifies.
bool QkPrepSupports(int64_t head_dim);
absl::Status QkPrep(const QkPrepParams& p, GpuStream stream);
// QkPrep (prep) and decode attention (p) in one launch for one token per sequence (p's
// max_tokens_per_seq 1, bf16, head_dim 64 or 128, an sm_90 device; MOESHARD_ATTN_FUSED_DECODE=0
// never): the queries normed and rotated on chip (prep.q is left as it was), the new K/V written
// by the split that reads them, 8 splits a KV head merged in a thread-block cluster.
bool AttentionDecodeFusedSupports(const AttentionParams& p, const QkPrepParams& prep);
absl::Status AttentionDecodeFused(const AttentionParams& p, const QkPrepParams& prep, GpuStream stream);
absl::Status Attention(const AttentionParams& p, GpuStream stream);
// Which kernel the tensor-core split decode takes for head_dim 64 and 128 on sm_90: 1 the
// long-context one (attention_decode_split.cu), 0 attention_decode_tc.cu's, -1 (the start) as
// MOESHARD_ATTN_DECODE_SPLIT says (unset: 1) — so that one process can test both.
void SetAttentionDecodeSplitKernel(int mode);
// Bytes of AttentionParams::workspace that let the split-decode kernel cut each of
// num_tokens tokens' keys into up to max_splits ranges (capped at kAttentionMaxSplits, gpu_params.h). A
// smaller workspace is fine: the kernel then uses fewer splits (one without any workspace).
int64_t AttentionWorkspaceBytes(int64_t num_tokens, int64_t num_heads, int64_t head_dim, int64_t max_splits = 32);
// The kernel Attention would run for p (p.algo when set; kAuto resolved), or an error if
// the forced one cannot run this shape.
absl::StatusOr<AttentionAlgo> ResolveAttentionAlgo(const AttentionParams& p);
absl::Status Routing(const RoutingParams& p, GpuStream stream);
absl::Status SiluMul(const SiluMulParams& p, GpuStream stream);
absl::Status HeadGate(const HeadGateParams& p, GpuStream stream);
absl::Status AddBias(const AddBiasParams& p, GpuStream stream);
absl::Status Convert(const ConvertParams& p, GpuStream stream);
// Each row's greedy token (worker/sampler.h's ArgMax), with ArgMaxBytes(rows) of device scratch.
int64_t ArgMaxBytes(int64_t rows);
absl::Status ArgMax(const ArgMaxParams& p, GpuStream stream);

// Synthetic weights (benchmarks).
absl::Status Fill(const FillParams& p, GpuStream stream);

}  // namespace moeshard::gpu
