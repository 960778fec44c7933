// Internal: the kernel launchers defined in the .cu files, called by gpu_ops.cc after it
// has validated the params. Each returns the launch error (cudaGetLastError).
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/gpu_params.h"

namespace moeshard::gpu {

cudaError_t LaunchExpand(const ExpandParams& p, cudaStream_t stream);
cudaError_t LaunchMatMul(const MatMulParams& p, cudaStream_t stream);
cudaError_t LaunchEmbed(const EmbedParams& p, cudaStream_t stream);
cudaError_t LaunchRmsNorm(const RmsNormParams& p, cudaStream_t stream);
cudaError_t LaunchResidual(const ResidualParams& p, cudaStream_t stream);
cudaError_t LaunchRope(const RopeParams& p, cudaStream_t stream);
cudaError_t LaunchKvWrite(const KvWriteParams& p, cudaStream_t stream);
cudaError_t LaunchKvDequant(const KvDequantParams& p, cudaStream_t stream);
cudaError_t LaunchQkPrep(const QkPrepParams& p, cudaStream_t stream);
cudaError_t LaunchAttention(const AttentionParams& p, cudaStream_t stream);
cudaError_t LaunchRouting(const RoutingParams& p, cudaStream_t stream);
cudaError_t LaunchSiluMul(const SiluMulParams& p, cudaStream_t stream);
cudaError_t LaunchHeadGate(const HeadGateParams& p, cudaStream_t stream);
cudaError_t LaunchAddBias(const AddBiasParams& p, cudaStream_t stream);
cudaError_t LaunchConvert(const ConvertParams& p, cudaStream_t stream);
cudaError_t LaunchFill(const FillParams& p, cudaStream_t stream);
cudaError_t LaunchArgMax(const ArgMaxParams& p, cudaStream_t stream);
// The fused decode attention (attention_decode_tc.cu): QkPrep's work and the split merge in
// one launch, for one token per sequence on an sm_90 device.
bool DecodeFusedSupports(const AttentionParams& p, const QkPrepParams& qp);
cudaError_t LaunchAttentionDecodeFused(const AttentionParams& p, const QkPrepParams& qp, cudaStream_t stream);
int64_t ArgMaxScratchBytes(int64_t rows);
int64_t MaxAttentionHeadDim();
// Attention kernels beside the reference one (attention_tiled.cu, attention_tc.cu,
// attention_decode.cu).
cudaError_t LaunchAttentionTiled(const AttentionParams& p, cudaStream_t stream);
cudaError_t LaunchAttentionTensorCore(const AttentionParams& p, cudaStream_t stream);  // bf16, head_dim <= 128
// The wgmma prefill kernel: whether it can run p on the current device (attention_wgmma.cu), and
// its launch (attention_wgmma_ws.cu).
bool WgmmaAttentionSupports(const AttentionParams& p);
cudaError_t LaunchAttentionWgmma(const AttentionParams& p, cudaStream_t stream);
cudaError_t LaunchAttentionSplitDecode(const AttentionParams& p, int64_t splits, cudaStream_t stream);
int64_t AttentionDecodeSplits(const AttentionParams& p);
// The streaming split-decode kernel (attention_decode_async.cu): bf16 KV, head_dim 64 or 128.
bool DecodeAsyncSupports(const AttentionParams& p);
cudaError_t LaunchAttentionDecodeAsync(const AttentionParams& p, int64_t splits, cudaStream_t stream);  // from the workspace and the SM count
// The tensor-core split-decode kernel (attention_decode_tc.cu): bf16 activations, a bf16 or FP8
// cache, head_dim <= 128 (a multiple of 16), group <= 16; MOESHARD_ATTN_TC_DECODE=0 turns it off.
bool DecodeTcSupports(const AttentionParams& p);
cudaError_t LaunchAttentionDecodeTc(const AttentionParams& p, int64_t splits, cudaStream_t stream);
int DecodeTcCtasPerSm(const AttentionParams& p);  // resident CTAs an SM of that kernel (occupancy API)
// Its long-context form (attention_decode_split.cu: a ring of tensor-map boxes a warp, FP8 K
// into the mma fragments), which LaunchAttentionDecodeTc takes where it applies: head_dim 64 or
// 128, blocks of a multiple of 16 tokens, the cache's num_blocks known, sm_90;
// MOESHARD_ATTN_DECODE_SPLIT=0 (SetAttentionDecodeSplitKernel) turns it off.
bool DecodeSplitSupports(const AttentionParams& p);
cudaError_t LaunchAttentionDecodeSplit(const AttentionParams& p, int64_t splits, cudaStream_t stream);
int DecodeSplitCtasPerSm(const AttentionParams& p);
int64_t MaxAttentionSplits();
int64_t MaxSplitDecodeGroup();  // query heads per KV head the split-decode kernel takes
int64_t MaxRoutingTopK();

}  // namespace moeshard::gpu
