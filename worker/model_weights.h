// The weights one worker holds: views into the memory-mapped checkpoint (no copies of
// matrices; small vectors such as norms are expanded to fp32). Resolves tensor names for
// each architecture and file format (hub safetensors with one tensor per expert, or GGUF
// with stacked experts), checks every shape and dtype, and slices for tensor parallelism.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/formats/tensor_source.h"
#include "common/model/model_config.h"
#include "common/model/shard.h"
#include "kernels/cpu/weight_ref.h"

namespace moeshard {

struct ExpertWeights {
  WeightRef gate, up, down;  // gate/up [I, Lw], down [Lw, I]
};

struct LayerWeights {
  // Attention.
  std::vector<float> attn_norm, q_norm, k_norm, attn_out_norm, attn_alpha, attn_beta;
  WeightRef q, k, v, o, head_gate;
  std::vector<float> q_bias, k_bias, v_bias, o_bias;
  // MLP.
  std::vector<float> moe_norm, moe_out_norm, moe_alpha, moe_beta;
  WeightRef router, latent_in, latent_out;
  std::vector<ExpertWeights> experts;  // the local experts, expert_begin + i
  ExpertWeights dense;                 // dense-MLP layers
};

struct ModelWeights {
  WeightRef embed;    // [V, H] (first stage, or tied head)
  WeightRef lm_head;  // [V, H] (last stage)
  std::vector<float> final_norm;
  std::vector<LayerWeights> layers;  // shard.layer_begin .. layer_end
  int64_t expert_begin = 0, num_local_experts = 0;
  int64_t num_local_heads = 0, num_local_kv_heads = 0, local_dense_intermediate = 0;
};

// Validates the shard first (ValidateShard, common/model/shard.h).
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(const ModelConfig& c,
                                                               const TensorSource& src,
                                                               const ShardSpec& shard);

}  // namespace moeshard
