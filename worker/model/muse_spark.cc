// Muse Spark (shared/docs/muse-spark.md; executable form: shared/reference/muse_spark.py).
// Attention: input RMSNorm, Q/K/V, no q/k norm; RoPE and a sliding window on sliding layers,
// neither on full layers (LayerSpec.rope / .sliding); a sigmoid gate per head from the normalized
// input, o-proj; gated residual s = alpha ⊙ s + beta ⊙ (rmsnorm(a) ⊙ w). MLP: RMSNorm, the fp32
// router with a softmax over the top-k logits only, latent_in (hidden → L), the experts at width
// L with a weight-free RMS norm of each expert's output, the weighted mix, latent_out (L →
// hidden); gated residual. A layer LayerSpec marks dense runs the SwiGLU MLP instead.
#include "common/status.h"
#include "worker/model/model.h"

namespace moeshard {

absl::Status RunMuseSparkLayers(const ModelConfig& config, int64_t layer_begin, int64_t layer_end, LayerOps& ops) {
  const int64_t num_layers = layer_end - layer_begin;
  for (int64_t li = 0; li < num_layers; ++li) {
    const LayerSpec& spec = config.layers[layer_begin + li];
    RETURN_IF_ERROR(ops.AttentionInput(li, {.qk_norm = false, .rope = spec.rope}));
    RETURN_IF_ERROR(ops.Attention(li, spec.sliding ? config.sliding_window : 0));
    RETURN_IF_ERROR(ops.OutputGate(li));
    RETURN_IF_ERROR(ops.OutputProjection(li));
    RETURN_IF_ERROR(ops.Residual(li, Block::kAttention, {.gated = true, .next = NextMlp(spec)}));

    RETURN_IF_ERROR(ops.MlpInput(li, {.f32_copy = spec.moe}));
    if (!spec.moe) {
      RETURN_IF_ERROR(ops.DenseMlp(li));
    } else {
      RETURN_IF_ERROR(ops.Route(li, {.softmax_topk_only = true, .renormalize = true, .latent = true}));
      RETURN_IF_ERROR(ops.LatentIn(li));
      RETURN_IF_ERROR(ops.Experts(li, {.output_norm = true, .residual = std::nullopt}));
      RETURN_IF_ERROR(ops.LatentOut(li));
    }
    RETURN_IF_ERROR(ops.Residual(li, Block::kMlp, {.gated = true, .next = NextAttention(li, num_layers)}));
  }
  return absl::OkStatus();
}

}  // namespace moeshard
