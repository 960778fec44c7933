// The weights of one GPU worker, on the device: dense projections expanded once to the
// activation dtype (cuBLAS reads them) — or, for Q8_0 matrices under bf16 activations, kept
// at 8.5 bits as split Q8 (kernels/cuda/gemv.h; MOESHARD_DENSE_Q8=0 expands them too) — the
// router in fp32, norms and biases in fp32, and
// the experts and the embedding kept in their stored format (NVFP4, MXFP4, Q8_0, bf16, …)
// for kernels that expand them on chip. Built from the CPU's ModelWeights views of the
// memory-mapped checkpoint, so both backends read the same slices of the same tensors.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/gemm.h"
#include "kernels/moe/moe_expert.h"
#include "worker/gpu/device_memory.h"
#include "worker/gpu/expert_repack.h"
#include "worker/model_weights.h"

namespace moeshard::gpu {

struct GpuExpertWeights {
  DenseWeight gate, up, down;  // dense MLP layers (expanded)
};

struct GpuLayerWeights {
  const float *attn_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  const float *attn_out_norm = nullptr, *attn_alpha = nullptr, *attn_beta = nullptr;
  DenseWeight q, k, v, o, head_gate;
  const float *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr, *o_bias = nullptr;
  const float *moe_norm = nullptr, *moe_out_norm = nullptr, *moe_alpha = nullptr, *moe_beta = nullptr;
  DenseWeight router, latent_in, latent_out;  // router always fp32
  const MoeExpertWeights* experts = nullptr;  // device array [num_local_experts]
  uint32_t expert_formats = 0;                 // MoeExpertFormats of `experts` (which kernels apply)
  GpuExpertWeights dense;
};

struct GpuModelWeights {
  WeightRef embed;     // stored format, device pointers
  DenseWeight lm_head;
  const float* final_norm = nullptr;
  std::vector<GpuLayerWeights> layers;
  // For each layer with experts, in order: why they stay in the stored layout, in words ("" when
  // repacked for the streaming kernels); the runner's backend string names the first reason.
  std::vector<std::string> experts_stored_why;
  void* gemm_scratch = nullptr;  // where Gemm expands split-Q8 row chunks (prefill-sized steps)
  size_t gemm_scratch_bytes = 0;
  DevicePool pool;     // owns all of the above
};

// Whether Q8_0 dense matrices stay split Q8 under `act` activations (bf16 and not
// MOESHARD_DENSE_Q8=0).
bool KeepDenseQ8(ActDType act);
// A Q8_0 view in device memory → a split-Q8 DenseWeight allocated in `pool` (x in `act`).
absl::StatusOr<DenseWeight> SplitQ8Dense(const WeightRef& q8_dev, DevicePool& pool, ActDType act, GpuStream stream);
// Allocates g->gemm_scratch when some dense weight is split Q8 (up to 64 MiB of expanded rows).
absl::Status AllocGemmScratch(GpuModelWeights* g, ActDType act);

// `act`: the dtype dense weights are expanded to; `repack`: the expert formats kept in the
// streaming kernels' layout (worker/gpu/expert_repack.h).
absl::StatusOr<std::unique_ptr<GpuModelWeights>> UploadModelWeights(const ModelWeights& w, ActDType act,
                                                                    GpuStream stream, RepackPolicy repack = {});

}  // namespace moeshard::gpu
