// One model description for every supported architecture. A layer is attention + an
// MoE (or dense) MLP; what differs between qwen3_moe and muse_spark is a set of options
// here, not a second forward pass. Parsed and validated once from a Hugging Face
// config.json or from GGUF metadata; immutable afterwards.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace moeshard {

class GgufFile;

enum class Arch { kQwen3Moe, kMuseSpark };

struct LayerSpec {
  bool sliding = false;  // sliding-window attention (window = ModelConfig::sliding_window)
  bool rope = true;      // RoPE on q and k (muse_spark: sliding layers only)
  bool moe = true;       // routed experts; false = dense SwiGLU MLP (qwen3 mlp_only_layers)
};

struct ModelConfig {
  Arch arch = Arch::kQwen3Moe;
  std::string model_type;  // "qwen3_moe" | "muse_spark"
  int64_t vocab_size = 0, hidden_size = 0, num_layers = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  double rope_theta = 10000.0;
  float rms_eps = 1e-6f;
  int64_t sliding_window = 0;  // 0 = none
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;

  // MoE
  int64_t num_experts = 0, top_k = 0;
  int64_t expert_intermediate = 0;  // I: width of each expert's gate/up output
  int64_t dense_intermediate = 0;   // qwen3 dense-MLP layers
  bool norm_topk_prob = true;       // renormalize the top-k weights (qwen3); muse always does

  // Architecture options (set from arch).
  bool qk_norm = false;           // per-head RMSNorm of q and k (qwen3)
  bool attn_output_gate = false;  // sigmoid(x Wgate) per head (muse)
  bool gated_residual = false;    // s = alpha*s + beta*(rmsnorm(out)*w) (muse), else s += out
  bool router_softmax_topk_only = false;  // softmax over the top-k logits (muse) vs all experts
  bool expert_output_norm = false;  // weight-free RMS norm of each expert's output (muse)
  int64_t latent_size = 0;          // muse: experts work in L = latent_size; 0 = hidden
  bool nvfp4_experts = false;       // quantization_config.quant_method == "nvfp4"

  std::vector<LayerSpec> layers;
  std::vector<int32_t> eos_token_ids;
  int32_t bos_token_id = -1;

  int64_t expert_width() const { return latent_size > 0 ? latent_size : hidden_size; }
  // A short identity string (arch and shapes), used in the worker handshake.
  std::string Fingerprint() const;
};

// Errors name the key: unknown architecture, missing or wrongly typed keys, shapes that
// do not fit (heads not dividing, top_k > experts, layer_types of the wrong length...).
absl::StatusOr<ModelConfig> ParseHfConfig(const nlohmann::json& j);
absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& config_json_path);
absl::StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& gguf);

}  // namespace moeshard
