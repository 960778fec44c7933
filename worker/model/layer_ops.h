// The ops a model file writes its layer sequence in, and that every backend implements.
//
// A backend keeps its own activations (the residual stream s, the current block's normalized
// input, q/k/v, the block's output...) in its own buffers; each op is one named step on "the
// current layer" li (a local index: 0 is the shard's first layer). The model file
// (worker/model/qwen3_moe.cc, muse_spark.cc) decides which ops run and with which options; the
// backend decides how: it may fuse an op with its neighbours (the GPU runs q/k norm, RoPE and
// the KV write as one kernel, and the next block's input norm inside the residual update), and
// the hints an op takes (ResidualOpts::next) exist only for such fusions: a backend that does
// not fuse ignores them. No backend branches on an architecture flag of ModelConfig; it may read
// shapes from it.
//
// One layer is an attention block then an MLP block:
//   AttentionInput → Attention → [OutputGate] → OutputProjection → Residual(kAttention)
//   MlpInput → DenseMlp | (Route → [LatentIn] → Experts → [LatentOut]) → Residual(kMlp)
// Every op returns a status; ops run in the order called, on the backend's one stream, from
// the runner's own RunLayers/LayersDevice (one step at a time; not thread-safe).
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"

namespace moeshard {

enum class Block { kAttention, kMlp };

struct AttentionInputOpts {
  bool qk_norm = false;  // per-head RMSNorm of q and k (weights q_norm, k_norm)
  bool rope = true;      // NeoX RoPE on q and k at each token's position
};

// What the block after a residual update starts with, so that a backend can compute that
// block's input norm in the same pass over the stream.
struct NextInput {
  enum class Kind { kNone, kMlp, kAttention };
  Kind kind = Kind::kNone;  // kMlp: this layer's MLP block; kAttention: layer li + 1's attention
  bool f32_copy = false;    // that block also wants its normalized input in fp32 (MlpInputOpts)
};

struct ResidualOpts {
  bool gated = false;  // s = alpha ⊙ s + beta ⊙ (rmsnorm(out) ⊙ w), else s += out
  NextInput next;      // a fusion hint only
};

struct MlpInputOpts {
  bool f32_copy = false;  // keep an fp32 copy of the normalized input (the fp32 router reads it)
};

struct RouteOpts {
  bool softmax_topk_only = false;  // softmax over the top-k logits, else over all experts
  bool renormalize = true;         // renormalize the top-k weights to sum to one
  bool latent = false;             // LatentIn/LatentOut follow: experts work at latent width
};

struct ExpertsOpts {
  bool output_norm = false;  // weight-free RMS norm of each expert's output before the mix
  // The MLP block's residual update, when it follows the experts (no LatentOut between), so that a
  // backend may run it inside the experts' last kernel: a fusion hint only, as ResidualOpts::next.
  // Residual(kMlp) is still called, with the same options.
  std::optional<ResidualOpts> residual;
};

class LayerOps {
 public:
  virtual ~LayerOps() = default;

  // Attention block. Input norm (attn_norm) → Q/K/V projections (+bias) → per-head q/k norm →
  // RoPE; the step's K/V are in the cache by the time Attention reads it.
  virtual absl::Status AttentionInput(int64_t li, const AttentionInputOpts& opts) = 0;
  // Paged causal attention of q over the cache; window 0 = full context, else sliding window.
  virtual absl::Status Attention(int64_t li, int64_t window) = 0;
  // o *= sigmoid(x · Wgate) per head, x the block's normalized input.
  virtual absl::Status OutputGate(int64_t li) = 0;
  // The block's output: o · Wo (+bias), all-reduced over the tensor-parallel group.
  virtual absl::Status OutputProjection(int64_t li) = 0;
  // The residual stream takes the block's output (attention: OutputProjection's; MLP: the
  // dense MLP's, the experts' or LatentOut's), with that block's out_norm/alpha/beta.
  virtual absl::Status Residual(int64_t li, Block block, const ResidualOpts& opts) = 0;

  // MLP block. Input norm (moe_norm).
  virtual absl::Status MlpInput(int64_t li, const MlpInputOpts& opts) = 0;
  // SwiGLU MLP of the layer's dense weights, all-reduced: the block's output.
  virtual absl::Status DenseMlp(int64_t li) = 0;
  // Router logits in fp32 and the top-k experts with their weights, per token.
  virtual absl::Status Route(int64_t li, const RouteOpts& opts) = 0;
  // The experts' input: x · Wlatent_in (hidden → latent width).
  virtual absl::Status LatentIn(int64_t li) = 0;
  // The routed SwiGLU experts of this shard, mixed by weight per token, all-reduced; without a
  // latent, the block's output.
  virtual absl::Status Experts(int64_t li, const ExpertsOpts& opts) = 0;
  // The block's output: mix · Wlatent_out (latent → hidden width).
  virtual absl::Status LatentOut(int64_t li) = 0;
};

}  // namespace moeshard
