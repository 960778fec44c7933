// The CUDA backend of ModelRunner: every op of the forward pass on one GPU, on one stream.
// The residual stream stays fp32; GEMM inputs and outputs are bf16 (fp32 accumulation) or,
// with ActPrecision::kFloat32, fp32 without TF32. Dense projections run through cuBLAS,
// experts through kernels/moe (weights expanded on chip), attention over a paged KV cache
// in fp32, bf16 or FP8. Scratch comes from a StepArena sized at creation.
// Tensor parallel: partial sums are staged through pinned host memory and all-reduced by
// the given Communicator (Gloo, or a LocalGroup for ranks in one process), so two workers
// on one GPU or GPUs without P2P still work.
#pragma once

#include <memory>

#include "worker/model_runner.h"

namespace moeshard {

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateGpuModelRunner(const ModelConfig& config, const TensorSource& src,
                                                                   const ShardSpec& shard, const RunnerOptions& options,
                                                                   Communicator* tp_comm);

}  // namespace moeshard
