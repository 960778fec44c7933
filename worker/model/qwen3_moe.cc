// Qwen3-MoE (Hugging Face Qwen3MoeForCausalLM). Attention: input RMSNorm, Q/K/V (+bias when
// attention_bias), per-head RMSNorm of q and k, RoPE on every layer, a sliding window on the
// layers layer_types marks sliding, o-proj, plain residual. MLP: RMSNorm, then either the dense
// SwiGLU (mlp_only_layers, decoder_sparse_step) or the fp32 router with a softmax over all
// experts, top-k (renormalized when norm_topk_prob) and the experts at hidden width; plain residual.
#include "common/status.h"
#include "worker/model/model.h"

namespace moeshard {

absl::Status RunQwen3MoeLayers(const ModelConfig& config, int64_t layer_begin, int64_t layer_end, LayerOps& ops) {
  const int64_t num_layers = layer_end - layer_begin;
  for (int64_t li = 0; li < num_layers; ++li) {
    const LayerSpec& spec = config.layers[layer_begin + li];
    RETURN_IF_ERROR(ops.AttentionInput(li, {.qk_norm = true, .rope = true}));
    RETURN_IF_ERROR(ops.Attention(li, spec.sliding ? config.sliding_window : 0));
    RETURN_IF_ERROR(ops.OutputProjection(li));
    RETURN_IF_ERROR(ops.Residual(li, Block::kAttention, {.gated = false, .next = NextMlp(spec)}));

    const ResidualOpts mlp_residual{.gated = false, .next = NextAttention(li, num_layers)};
    RETURN_IF_ERROR(ops.MlpInput(li, {.f32_copy = spec.moe}));
    if (spec.moe) {
      RETURN_IF_ERROR(ops.Route(li, {.softmax_topk_only = false, .renormalize = config.norm_topk_prob, .latent = false}));
      RETURN_IF_ERROR(ops.Experts(li, {.output_norm = false, .residual = mlp_residual}));
    } else {
      RETURN_IF_ERROR(ops.DenseMlp(li));
    }
    RETURN_IF_ERROR(ops.Residual(li, Block::kMlp, mlp_residual));
  }
  return absl::OkStatus();
}

}  // namespace moeshard
