// Experts one at a time: gather the expert's tokens, three MatMuls (each weight row
// expanded once for all of them), then scatter into the slots' outputs; the weighted
// sum runs in slot order per token.
#include "kernels/cpu/moe_ref.h"

#include <cmath>

#include "kernels/cpu/ops.h"

namespace moeshard {

void MoeExpertRef(const std::vector<MoeRefExpert>& experts, int64_t width, int64_t inter, int64_t num_tokens, int top_k,
                  const int32_t* ids, const float* weights, const float* x, bool output_norm, float eps, float* out) {
  const int64_t L = width, I = inter, T = num_tokens;
  const int64_t E = static_cast<int64_t>(experts.size());
  // Each pair's normalized expert output, [T * top_k, L]; filled for local pairs only.
  std::vector<float> pair_out(T * top_k * L, 0.f);
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> pairs;
    for (int64_t i = 0; i < T * top_k; ++i) {
      if (ids[i] == e) pairs.push_back(i);
    }
    if (pairs.empty()) continue;
    const int64_t n = static_cast<int64_t>(pairs.size());
    std::vector<float> xe(n * L), g(n * I), u(n * I), d(n * L);
    for (int64_t r = 0; r < n; ++r) {
      const float* src = x + (pairs[r] / top_k) * L;
      std::copy(src, src + L, xe.data() + r * L);
    }
    MatMul(xe.data(), n, experts[e].gate, g.data());
    MatMul(xe.data(), n, experts[e].up, u.data());
    for (int64_t i = 0; i < n * I; ++i) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
    MatMul(g.data(), n, experts[e].down, d.data());
    if (output_norm) RmsNorm(d.data(), n, L, nullptr, eps, d.data());
    for (int64_t r = 0; r < n; ++r) {
      std::copy(d.data() + r * L, d.data() + (r + 1) * L, pair_out.data() + pairs[r] * L);
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    float* o = out + t * L;
    std::fill(o, o + L, 0.f);
    for (int k = 0; k < top_k; ++k) {
      const int64_t i = t * top_k + k;
      if (ids[i] < 0 || ids[i] >= E) continue;
      const float w = weights[i];
      const float* d = pair_out.data() + i * L;
      for (int64_t j = 0; j < L; ++j) o[j] += w * d[j];
    }
  }
}

}  // namespace moeshard
