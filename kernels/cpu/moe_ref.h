// CPU reference of one GPU's MoE expert step (kernels/moe/moe_expert.h) in float32: what
// the GPU kernels' tests and benchmark compare against. Host pointers throughout.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/weight_ref.h"

namespace moeshard {

struct MoeRefExpert {
  WeightRef gate, up;  // [I, L]
  WeightRef down;      // [L, I]
};

// out[t] = Σ_k weights[t,k] · norm?(down_e(silu(gate_e x_t) ⊙ up_e x_t)), e = ids[t,k],
// k in order; ids < 0 (or ≥ experts.size()) are skipped; rows with no expert are zero.
// norm: weight-free RMSNorm over L with `eps`. x [T, L], out [T, L].
void MoeExpertRef(const std::vector<MoeRefExpert>& experts, int64_t width, int64_t inter, int64_t num_tokens, int top_k,
                  const int32_t* ids, const float* weights, const float* x, bool output_norm, float eps, float* out);

}  // namespace moeshard
